"""An ordinary Flower app, not written for any particular strategy."""
