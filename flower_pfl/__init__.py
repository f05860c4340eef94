"""flower-pfl core: personalized federated learning math, data and models.

Nothing in this package imports Flower; ``strategies``, ``client_apps`` and
``server_apps`` wire it into Flower.
"""

__version__ = "0.1.0"
