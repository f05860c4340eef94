"""Ditto (Li, Hu, Beirami, Smith 2021): a global model by FedAvg and, on every client, a personal
model ``v_i`` trained on ``f_i(v) + λ/2 ||v − w||²`` toward the global model it received."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from ..layout import flatten_module, load_flat_
from ..solvers import LocalResult, local_sgd

#: config key: Ditto's lambda (its presence makes the client run Ditto and evaluate its personal model)
LAMBDA = "ditto-lambda"


def ditto_personal_step(model: nn.Module, personal: torch.Tensor | None, received: Sequence[torch.Tensor], x: torch.Tensor,
                        y: torch.Tensor, *, lam: float, steps: int, lr: float, batch_size: int,
                        generator: torch.Generator) -> tuple[LocalResult, torch.Tensor]:
    """Train the personal model (flat ``personal``; ``None``: start from the received global model)
    for ``steps`` proximal SGD steps toward ``received`` (Ditto's Algorithm 1, personal update),
    using ``model`` as scratch space. Returns the result and the new flat personal model."""
    if lam < 0:
        raise ValueError(f"Ditto's lambda must be >= 0, got {lam}")
    if personal is not None:
        load_flat_(model, personal)
    result = local_sgd(model, x, y, steps=steps, lr=lr, batch_size=batch_size, prox_mu=lam, anchor=received,
                       generator=generator)
    return result, flatten_module(model)
