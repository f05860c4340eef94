"""FedACS for the Message API (``@app.main()`` + ``strategy.start``)."""

from __future__ import annotations

from flower_pfl.methods import FedACSRule

from .personalized import PersonalizedStrategy


class FedACS(PersonalizedStrategy):
    """``strategies.FedACS`` for the Message API: the same method and arguments."""

    rule_class = FedACSRule
