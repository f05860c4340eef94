"""Local training: every client trains only its own model; the server just keeps it."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..layout import ParamLayout
from .base import PROXIMAL_MU


@dataclass
class LocalRule:
    all_clients_train: bool = False
    name: str = field(default="local", init=False)

    def personalize(self, models: torch.Tensor, layout: ParamLayout) -> tuple[torch.Tensor, None]:
        return models, None

    def client_config(self) -> dict[str, float | int | str]:
        return {PROXIMAL_MU: 0.0}
