"""A Flower app, Message API (``@app.main()``), on flower-pfl's strategies with the user's own
training loop and ``client_apps.own_loop`` for methods that ask the client for more."""
