"""FedAMP and HeurFedAMP for the Message API (``@app.main()`` + ``strategy.start``)."""

from __future__ import annotations

from flower_pfl.methods import FedAMPRule, HeurFedAMPRule

from .personalized import PersonalizedStrategy


class FedAMP(PersonalizedStrategy):
    """``strategies.FedAMP`` for the Message API: the same method and arguments."""

    rule_class = FedAMPRule


class HeurFedAMP(PersonalizedStrategy):
    """``strategies.HeurFedAMP`` for the Message API: the same method and arguments."""

    rule_class = HeurFedAMPRule
