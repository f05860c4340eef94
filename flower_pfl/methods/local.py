"""Local training: every client trains only its own model; the server just keeps it."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..layout import ParamLayout
from .base import PROXIMAL_MU


@dataclass
class LocalRule:
    name: str = field(default="local", init=False)

    def personalize(self, models: torch.Tensor, layout: ParamLayout) -> torch.Tensor:
        return models

    def client_config(self) -> dict[str, float | int | str]:
        return {PROXIMAL_MU: 0.0}
