"""Local training baseline for the Message API."""

from __future__ import annotations

from typing import Any

from flower_pfl.methods import LocalRule

from .personalized import PersonalizedStrategy


class Local(PersonalizedStrategy):
    """Every sampled client trains its own model with plain local SGD; nothing is shared."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(LocalRule(), **kwargs)
