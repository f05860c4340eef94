"""Flower strategies of flower-pfl.

``strategies.<Name>`` are legacy ``flwr.server.strategy.Strategy`` classes
(``configure_fit`` / ``aggregate_fit``); ``strategies.message.<Name>`` are their
Message-API twins. Both share all logic through ``PersonalizedServer``.
FedAvg, FedProx, FedAvgM and FedAdam are Flower's own, re-exported for convenience.
"""

from flwr.server.strategy import FedAdam, FedAvg, FedAvgM, FedProx

from .fedacs import FedACS
from .fedmcsa import FedMCSA
from .igfl import IGFL
from .legacy import PersonalizedStrategy
from .local import Local
from .personalized import PersonalizedServer, UpdateRejected

__all__ = ["FedACS", "FedAdam", "FedAvg", "FedAvgM", "FedMCSA", "FedProx", "IGFL", "Local", "PersonalizedServer", "PersonalizedStrategy", "UpdateRejected"]
