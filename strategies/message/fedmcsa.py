"""FedMCSA for the Message API (``@app.main()`` + ``strategy.start``)."""

from __future__ import annotations

from flower_pfl.methods import FedMCSARule

from .personalized import PersonalizedStrategy


class FedMCSA(PersonalizedStrategy):
    """``strategies.FedMCSA`` for the Message API: the same method and arguments."""

    rule_class = FedMCSARule
