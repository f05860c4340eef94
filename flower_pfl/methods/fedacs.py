"""FedACS (Chen, Li, Shen; paper 001): attention-based client selection."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..attention import cosine_similarity_matrix, quantile_threshold_weights
from ..client_step import PROXIMAL_MU, ClientStep
from ..layout import ParamLayout
from ..params import HALF_OPEN_UNIT, param
from ..server_step import PersonalizedStep, Settings, all_clients_train_param
from .base import Method


@dataclass
class FedACS(Method, PersonalizedStep):
    """FedACS (Chen, Li, Shen): each participant gets the similarity-weighted average of the
    participants whose cosine similarity to it exceeds the round's p-quantile, then trains
    locally from it.

    Server (eq. 4): ``u_i = Σ_j 1[s_ij > δ] s_ij w_j / Σ_j 1[s_ij > δ] s_ij`` with ``s_ij`` the cosine
    similarity of whole models and ``δ`` the ``p``-quantile of all ``s_ij`` of the round.
    Client (eq. 5): plain local SGD from ``u_i``.
    """

    name = "fedacs"
    strategy = "FedACS"
    client = ClientStep
    group = "paper"
    default_clients_per_round = 10
    state_attributes = ("last_similarity", "last_delta", "last_mask")

    p: float = param(0.5, key="fedacs-p", must=HALF_OPEN_UNIT,
                     doc="similarity threshold = this quantile of the round's similarities (0 keeps every positively similar client)")
    all_clients_train: bool = all_clients_train_param()
    #: similarity matrix, threshold δ and selection mask of the last round (diagnostics)
    last_similarity: torch.Tensor | None = field(default=None, init=False, repr=False)
    last_delta: float | None = field(default=None, init=False, repr=False)
    last_mask: torch.Tensor | None = field(default=None, init=False, repr=False)

    def personalize(self, models: torch.Tensor, layout: ParamLayout) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        self.last_similarity = cosine_similarity_matrix(models)
        weights, self.last_mask, self.last_delta = quantile_threshold_weights(self.last_similarity, self.p)
        return weights @ models, {"model": weights}

    def train_config(self) -> Settings:
        return {PROXIMAL_MU: 0.0}
