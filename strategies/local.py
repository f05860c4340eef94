"""Local training baseline for the legacy Flower API."""

from __future__ import annotations

from typing import Any

from flower_pfl.methods import LocalRule

from .legacy import PersonalizedStrategy


class Local(PersonalizedStrategy):
    """Every sampled client trains its own model with plain local SGD; nothing is shared.

    ``all_clients_train=True`` trains every client every round (the same local work as
    FedMCSA's Algorithm 1).
    """

    def __init__(self, *, all_clients_train: bool = False, **kwargs: Any) -> None:
        super().__init__(LocalRule(all_clients_train=all_clients_train), **kwargs)
