"""FedMCSA for the legacy Flower API."""

from __future__ import annotations

from typing import Any

from flower_pfl.layout import Grouping
from flower_pfl.methods import FedMCSARule

from .legacy import PersonalizedStrategy


class FedMCSA(PersonalizedStrategy):
    """FedMCSA (Guo et al.): layer-wise self-attention over the participants' models.

    Args:
        sigma: similarity scale of the attention softmax (paper default 50).
        lam: proximal weight of the client problem, sent as ``proximal-mu`` (paper default 5).
        grouping: ``"tensor"`` (weight and bias separate) or ``"module"``.
        all_clients_train: ``True``: every client trains every round, as the paper's
            Algorithm 1 (clients not sampled continue from their own model, anchored to the
            model they last received); ``False``: only the sampled clients train.
        **kwargs: see ``PersonalizedStrategy`` (``initial_parameters``, ``clients_per_round``, ...).
    """

    def __init__(self, *, sigma: float = 50.0, lam: float = 5.0, grouping: Grouping = "tensor",
                 all_clients_train: bool = False, **kwargs: Any) -> None:
        rule = FedMCSARule(sigma=sigma, lam=lam, grouping=grouping, all_clients_train=all_clients_train)
        super().__init__(rule, **kwargs)
