"""Local training: every client trains only its own model; the server just keeps it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from flower_pfl.engine.client_algorithm import ClientAlgorithm
from flower_pfl.engine.layout import ParamLayout
from flower_pfl.engine.server_algorithm import ClientId, Instruction
from flower_pfl.methods.all_clients_train import AllClientsTrain
from flower_pfl.methods.base import Method


@dataclass
class Local(Method, AllClientsTrain):
    """Local: every sampled client trains its own model with plain local SGD; nothing is shared."""

    name = "local"
    strategy = "Local"
    client = ClientAlgorithm
    default_clients_per_round = 10
    new_client_rule = "the starting model (nothing is shared)"

    def new_client_instructions(self, server_round: int, ids: Sequence[ClientId]) -> list[Instruction]:
        """A new client has nothing of the federation's: it evaluates the starting model."""
        return [Instruction(cid, self.initial, self.evaluation_config()) for cid in ids]

    def personalize(self, models: torch.Tensor, layout: ParamLayout) -> tuple[torch.Tensor, None]:
        return models, None
