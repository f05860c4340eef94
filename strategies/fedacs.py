"""FedACS for the legacy Flower API."""

from __future__ import annotations

from flower_pfl.methods import FedACSRule

from .legacy import PersonalizedStrategy


class FedACS(PersonalizedStrategy):
    """FedACS (Chen, Li, Shen): each sampled client gets the similarity-weighted average of
    the participants whose cosine similarity exceeds the round's p-quantile, then trains
    locally from it.

    Method arguments (see ``flower_pfl.methods.FedACSRule``): ``p`` (quantile, default 0.5),
    ``all_clients_train``. Everything else: see ``PersonalizedStrategy``.
    """

    rule_class = FedACSRule
