"""Strategies for Flower's Message API (``flwr.serverapp.strategy.Strategy``): the twins of
``strategies``' legacy classes, running the same method declarations on ``MethodStrategy`` (each
method's class made from its declaration, ``strategies.per_method``)."""

# re-exported (``X as X``: names of this package's API)
from flwr.serverapp.strategy import FedAdam as FedAdam
from flwr.serverapp.strategy import FedAvg as FedAvg
from flwr.serverapp.strategy import FedAvgM as FedAvgM
from flwr.serverapp.strategy import FedProx as FedProx

from flower_pfl.engine.deprecated import renamed
from strategies.message.method_strategy import MethodStrategy as MethodStrategy
from strategies.per_method import method_strategies

_METHODS = method_strategies(MethodStrategy, __name__)
globals().update(_METHODS)
__getattr__ = renamed(__name__, {"PersonalizedStrategy": ("strategies.message.method_strategy", "MethodStrategy"),
                                 "GlobalModelStrategy": ("strategies.message.method_strategy", "MethodStrategy")})
__all__ = sorted(["FedAdam", "FedAvg", "FedAvgM", "FedProx", "MethodStrategy", *_METHODS])
