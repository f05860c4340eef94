"""Flower strategies of flower-pfl.

``strategies.<Name>`` are legacy ``flwr.server.strategy.Strategy`` classes
(``configure_fit`` / ``aggregate_fit``); ``strategies.message.<Name>`` are their Message-API
twins. Both are made from the same method declaration (``flower_pfl.methods``): every
method's hyperparameters are typed keyword arguments of its class, documented in its
docstring. FedAvg, FedProx, FedAvgM and FedAdam are Flower's own, re-exported for convenience.
"""

# re-exported (``X as X``: names of this package's API)
from flwr.server.strategy import FedAdam as FedAdam
from flwr.server.strategy import FedAvg as FedAvg
from flwr.server.strategy import FedAvgM as FedAvgM
from flwr.server.strategy import FedProx as FedProx

from flower_pfl.server_step import UpdateRejected as UpdateRejected

from .declared import strategy_classes
from .legacy import LegacyMethodStrategy

_METHODS = strategy_classes(LegacyMethodStrategy, __name__)
globals().update(_METHODS)

#: the generic strategy, for a method instance of your own (``LegacyMethodStrategy(MyMethod(), ...)``)
PersonalizedStrategy = GlobalModelStrategy = LegacyMethodStrategy

__all__ = sorted(["FedAdam", "FedAvg", "FedAvgM", "FedProx", "GlobalModelStrategy", "LegacyMethodStrategy", "PersonalizedStrategy",
                  "UpdateRejected", *_METHODS])
