"""FedACS (Chen, Li, Shen; paper 001): attention-based client selection."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..attention import cosine_similarity_matrix, quantile_threshold_weights
from ..layout import ParamLayout
from .base import PROXIMAL_MU


@dataclass
class FedACSRule:
    """Server (eq. 4): ``u_i = sum_j 1[s_ij > delta] s_ij w_j / sum_j 1[s_ij > delta] s_ij``
    with ``s_ij`` the cosine similarity of the participants' whole models and ``delta``
    the ``p``-quantile of all ``s_ij`` of the round. Client (eq. 5): local SGD from ``u_i``
    (no proximal term).

    ``p`` sets how much clients collaborate: ``0`` keeps every positively similar client,
    values near ``1`` leave each client (almost) alone. The paper gives no value; the
    default is the median.
    """

    p: float = 0.5
    all_clients_train: bool = False
    name: str = field(default="fedacs", init=False)
    #: similarity matrix, threshold delta and selection mask of the last round (diagnostics)
    last_similarity: torch.Tensor | None = field(default=None, init=False, repr=False)
    last_delta: float | None = field(default=None, init=False, repr=False)
    last_mask: torch.Tensor | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0.0 <= self.p < 1.0:
            raise ValueError(f"p must be in [0, 1), got {self.p}")

    def personalize(self, models: torch.Tensor, layout: ParamLayout) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        self.last_similarity = cosine_similarity_matrix(models)
        weights, self.last_mask, self.last_delta = quantile_threshold_weights(self.last_similarity, self.p)
        return weights @ models, {"model": weights}

    def client_config(self) -> dict[str, float | int | str]:
        return {PROXIMAL_MU: 0.0}
