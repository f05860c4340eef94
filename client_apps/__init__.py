"""Flower ClientApps of flower-pfl."""
