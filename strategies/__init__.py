"""Flower strategies of flower-pfl.

``strategies.<Name>`` are legacy ``flwr.server.strategy.Strategy`` classes
(``configure_fit`` / ``aggregate_fit``); ``strategies.message.<Name>`` are their Message-API
twins. Both run the same method declaration (``flower_pfl.methods``) on a generic strategy
(``LegacyMethodStrategy``, ``MethodStrategy``); each method's class is made from its declaration
when the package is imported (``strategies.per_method``), with the method's hyperparameters as
typed keyword arguments documented in its docstring. FedAvg, FedProx, FedAvgM and FedAdam are
Flower's own, re-exported for convenience.
"""

# re-exported (``X as X``: names of this package's API)
from flwr.server.strategy import FedAdam as FedAdam
from flwr.server.strategy import FedAvg as FedAvg
from flwr.server.strategy import FedAvgM as FedAvgM
from flwr.server.strategy import FedProx as FedProx

from flower_pfl.engine.deprecated import renamed
from flower_pfl.engine.reply_checks import UpdateRejected as UpdateRejected
from strategies.legacy import LegacyMethodStrategy as LegacyMethodStrategy
from strategies.per_method import method_strategies

_METHODS = method_strategies(LegacyMethodStrategy, __name__)
globals().update(_METHODS)
__getattr__ = renamed(__name__, {"PersonalizedStrategy": ("strategies.legacy", "LegacyMethodStrategy"),
                                 "GlobalModelStrategy": ("strategies.legacy", "LegacyMethodStrategy")})
__all__ = sorted(["FedAdam", "FedAvg", "FedAvgM", "FedProx", "LegacyMethodStrategy", "UpdateRejected", *_METHODS])
