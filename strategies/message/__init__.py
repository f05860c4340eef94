"""Strategies for Flower's Message API (``flwr.serverapp.strategy.Strategy``): the twins of
``strategies``' legacy classes, running the same method declarations (one class per method in
``strategies/message/methods.py``)."""

# re-exported (``X as X``: names of this package's API)
from flwr.serverapp.strategy import FedAdam as FedAdam
from flwr.serverapp.strategy import FedAvg as FedAvg
from flwr.serverapp.strategy import FedAvgM as FedAvgM
from flwr.serverapp.strategy import FedProx as FedProx

from flower_pfl.engine.deprecated import renamed
from strategies.message import methods
from strategies.message.method_strategy import MethodStrategy as MethodStrategy
from strategies.message.methods import *  # noqa: F403  (one class per method, listed in its __all__)

__getattr__ = renamed(__name__, {"PersonalizedStrategy": ("strategies.message.method_strategy", "MethodStrategy"),
                                 "GlobalModelStrategy": ("strategies.message.method_strategy", "MethodStrategy")})

__all__ = sorted(["FedAdam", "FedAvg", "FedAvgM", "FedProx", "MethodStrategy", "PersonalizedStrategy",
                  *methods.__all__])
