"""Local training baseline for the Message API (``@app.main()`` + ``strategy.start``)."""

from __future__ import annotations

from flower_pfl.methods import LocalRule

from .personalized import PersonalizedStrategy


class Local(PersonalizedStrategy):
    """``strategies.Local`` for the Message API: the same method and arguments."""

    rule_class = LocalRule
