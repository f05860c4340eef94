"""Strategies for Flower's Message API (``flwr.serverapp.strategy.Strategy``): the twins of
``strategies``' legacy classes, made from the same method declarations."""

# re-exported (``X as X``: names of this package's API)
from flwr.serverapp.strategy import FedAdam as FedAdam
from flwr.serverapp.strategy import FedAvg as FedAvg
from flwr.serverapp.strategy import FedAvgM as FedAvgM
from flwr.serverapp.strategy import FedProx as FedProx

from ..declared import strategy_classes
from .method_strategy import MethodStrategy

_METHODS = strategy_classes(MethodStrategy, __name__)
globals().update(_METHODS)

#: the generic strategy, for a method instance of your own (``MethodStrategy(MyMethod(), ...)``)
PersonalizedStrategy = GlobalModelStrategy = MethodStrategy

__all__ = sorted(["FedAdam", "FedAvg", "FedAvgM", "FedProx", "GlobalModelStrategy", "MethodStrategy", "PersonalizedStrategy",
                  *_METHODS])
