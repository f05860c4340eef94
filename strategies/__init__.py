"""Flower strategies of flower-pfl.

``strategies.<Name>`` are legacy ``flwr.server.strategy.Strategy`` classes
(``configure_fit`` / ``aggregate_fit``); ``strategies.message.<Name>`` are their
Message-API twins. Personalized methods share their logic through
``PersonalizedServer``; global-model methods (IGFL, SCAFFOLD) through ``GlobalServer``.
FedAvg, FedProx, FedAvgM and FedAdam are Flower's own, re-exported for convenience.
"""

from flwr.server.strategy import FedAdam, FedAvg, FedAvgM, FedProx

from .client_personalized import APFL, Ditto, PerFedAvg, PFedMe
from .fedacs import FedACS
from .fedamp import FedAMP, HeurFedAMP
from .fedattn import FedAttn
from .fedmcsa import FedMCSA
from .global_model import GlobalModelStrategy
from .global_server import GlobalServer
from .igfl import IGFL
from .legacy import PersonalizedStrategy
from .local import Local
from .personalized import PersonalizedServer, UpdateRejected
from .scaffold import SCAFFOLD

__all__ = ["APFL", "Ditto", "FedACS", "FedAMP", "FedAttn", "HeurFedAMP", "FedAdam", "FedAvg", "FedAvgM", "FedMCSA", "FedProx", "GlobalModelStrategy", "GlobalServer", "IGFL", "Local",
           "PersonalizedServer", "PerFedAvg", "PFedMe", "PersonalizedStrategy", "SCAFFOLD", "UpdateRejected"]
