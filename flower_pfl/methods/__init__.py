"""Server-side rules of the personalized methods: how the server turns the
participants' stored models into the models it sends them, and which client
solver settings go with them. Pure tensor code; the Flower wiring is in
``strategies``.
"""

from .base import ServerRule
from .fedacs import FedACSRule
from .fedamp import FedAMPRule, HeurFedAMPRule
from .fedmcsa import FedMCSARule
from .local import LocalRule

__all__ = ["FedACSRule", "FedAMPRule", "FedMCSARule", "HeurFedAMPRule", "LocalRule", "ServerRule"]
