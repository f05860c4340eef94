"""Local training: every client trains only its own model; the server just keeps it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..client_step import PROXIMAL_MU, ClientStep
from ..layout import ParamLayout
from ..server_step import PersonalizedStep, Settings, all_clients_train_param
from .base import Method


@dataclass
class Local(Method, PersonalizedStep):
    """Local: every sampled client trains its own model with plain local SGD; nothing is shared."""

    name = "local"
    strategy = "Local"
    client = ClientStep
    default_clients_per_round = 10

    all_clients_train: bool = all_clients_train_param()

    def personalize(self, models: torch.Tensor, layout: ParamLayout) -> tuple[torch.Tensor, None]:
        return models, None

    def train_config(self) -> Settings:
        return {PROXIMAL_MU: 0.0}
