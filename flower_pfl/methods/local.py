"""Local training: every client trains only its own model; the server just keeps it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flower_pfl.engine.all_clients_train import AllClientsTrain
from flower_pfl.engine.client_algorithm import PROXIMAL_MU, ClientAlgorithm
from flower_pfl.engine.layout import ParamLayout
from flower_pfl.engine.server_algorithm import Settings
from flower_pfl.methods.base import Method


@dataclass
class Local(Method, AllClientsTrain):
    """Local: every sampled client trains its own model with plain local SGD; nothing is shared."""

    name = "local"
    strategy = "Local"
    client = ClientAlgorithm
    default_clients_per_round = 10


    def personalize(self, models: torch.Tensor, layout: ParamLayout) -> tuple[torch.Tensor, None]:
        return models, None

    def train_config(self, num_participants: int) -> Settings:
        return {PROXIMAL_MU: 0.0}
