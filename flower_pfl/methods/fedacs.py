"""FedACS (Chen, Li, Shen): attention-based client selection."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from flower_pfl.engine.attention_log import SimilaritySnapshot
from flower_pfl.engine.client_algorithm import ClientAlgorithm
from flower_pfl.engine.layout import ParamLayout
from flower_pfl.engine.params import HALF_OPEN_UNIT, param
from flower_pfl.methods.all_clients_train import AllClientsTrain
from flower_pfl.methods.attention import cosine_similarity_matrix, quantile_threshold_weights
from flower_pfl.methods.base import Method


@dataclass
class FedACS(Method, AllClientsTrain):
    """FedACS (Chen, Li, Shen): each participant gets the similarity-weighted average of the
    participants whose cosine similarity to it exceeds the round's p-quantile, then trains
    locally from it.

    Server (eq. 4): ``u_i = Σ_j 1[s_ij > δ] s_ij w_j / Σ_j 1[s_ij > δ] s_ij`` with ``s_ij`` the cosine
    similarity of whole models and ``δ`` the ``p``-quantile of all ``s_ij`` of the round.
    Client (eq. 5): plain local SGD from ``u_i``.
    """

    name = "fedacs"
    strategy = "FedACS"
    client = ClientAlgorithm
    group = "paper"
    default_clients_per_round = 10
    state_attributes = ("last_similarity", "last_delta", "last_mask")

    p: float = param(0.5, key="fedacs-p", must=HALF_OPEN_UNIT,
                     doc="similarity threshold = this quantile of the round's similarities (0 keeps every positively similar client)")
    #: similarity matrix, threshold δ and selection mask of the last round (diagnostics)
    last_similarity: torch.Tensor | None = field(default=None, init=False, repr=False)
    last_delta: float | None = field(default=None, init=False, repr=False)
    last_mask: torch.Tensor | None = field(default=None, init=False, repr=False)

    def personalize(self, models: torch.Tensor, layout: ParamLayout) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        self.last_similarity = cosine_similarity_matrix(models)
        weights, self.last_mask, self.last_delta = quantile_threshold_weights(self.last_similarity, self.p)
        return weights @ models, {"model": weights}

    def similarity_snapshot(self) -> SimilaritySnapshot | None:
        """The last round's ``s_ij``, the pairs above ``δ`` and ``δ``."""
        if self.last_similarity is None or self.last_mask is None or self.last_delta is None:
            return None
        return SimilaritySnapshot(self.last_similarity, self.last_mask, self.last_delta)
