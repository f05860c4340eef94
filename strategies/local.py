"""Local training baseline for the legacy Flower API."""

from __future__ import annotations

from flower_pfl.methods import LocalRule

from .legacy import PersonalizedStrategy


class Local(PersonalizedStrategy):
    """Every sampled client trains its own model with plain local SGD; nothing is shared.

    ``all_clients_train=True`` trains every client every round (the local work of FedMCSA's
    Algorithm 1). Everything else: see ``PersonalizedStrategy``.
    """

    rule_class = LocalRule
