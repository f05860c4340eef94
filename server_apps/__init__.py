"""Flower ServerApps of flower-pfl."""
