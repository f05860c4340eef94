"""Strategies for Flower's Message API (``flwr.serverapp.strategy.Strategy``)."""

from flwr.serverapp.strategy import FedAdam, FedAvg, FedAvgM, FedProx

from .fedacs import FedACS
from .fedmcsa import FedMCSA
from .igfl import IGFL
from .local import Local
from .personalized import PersonalizedStrategy

__all__ = ["FedACS", "FedAdam", "FedAvg", "FedAvgM", "FedMCSA", "FedProx", "IGFL", "Local", "PersonalizedStrategy"]
