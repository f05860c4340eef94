"""Strategies for Flower's Message API (``flwr.serverapp.strategy.Strategy``)."""

from flwr.serverapp.strategy import FedAdam, FedAvg, FedAvgM, FedProx

from .client_personalized import APFL, Ditto, PerFedAvg, PFedMe
from .fedacs import FedACS
from .fedamp import FedAMP, HeurFedAMP
from .fedattn import FedAttn
from .fedmcsa import FedMCSA
from .global_model import GlobalModelStrategy
from .igfl import IGFL
from .local import Local
from .personalized import PersonalizedStrategy
from .scaffold import SCAFFOLD

__all__ = ["APFL", "Ditto", "FedACS", "FedAMP", "FedAttn", "HeurFedAMP", "FedAdam", "FedAvg", "FedAvgM", "FedMCSA", "FedProx", "GlobalModelStrategy", "IGFL", "Local", "PerFedAvg", "PFedMe", "PersonalizedStrategy", "SCAFFOLD"]
