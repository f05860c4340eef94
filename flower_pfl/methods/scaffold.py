"""SCAFFOLD (Karimireddy et al. 2020), option II: control variates correct client drift."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from ..solvers import LocalResult, like_params, run_steps, trainable

#: config key of the server's control variate ``c``; reply key of the client's ``Δc_i`` (float32 bytes)
CONTROL, CONTROL_DELTA = "scaffold-control", "scaffold-control-delta"


def scaffold_local_sgd(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    steps: int,
    lr: float,
    batch_size: int,
    c_global: Sequence[torch.Tensor],
    c_local: Sequence[torch.Tensor],
    generator: torch.Generator,
) -> tuple[LocalResult, list[torch.Tensor], list[torch.Tensor]]:
    """``K = steps`` steps ``y <- y - η (g(y) + c - c_i)`` from the received ``x``, in place.

    Option II: ``c_i^+ = c_i - c + (x - y) / (K η)``. Returns the result, ``c_i^+`` and
    ``Δc_i = c_i^+ - c_i`` (the client keeps ``c_i^+`` in its state and reports ``Δc_i``).
    """
    if steps < 1 or lr <= 0:
        raise ValueError("SCAFFOLD needs steps >= 1 and lr > 0 (option II divides by K η)")
    params = trainable(model)
    start = [p.detach().clone() for p in params]
    c, ci = like_params(c_global, params, "global control variate"), like_params(c_local, params, "local control variate")

    def step(ps: list[torch.Tensor], grads: Sequence[torch.Tensor]) -> None:
        for p, g, cg, cl in zip(ps, grads, c, ci):
            p.sub_(lr * (g + cg - cl))

    result = run_steps(model, x, y, steps=steps, batch_size=batch_size, generator=generator, update=step)
    new_ci = new_control(ci, c, start, params, steps=steps, lr=lr)
    return result, new_ci, [n - o for n, o in zip(new_ci, ci)]


def new_control(c_local: Sequence[torch.Tensor], c_global: Sequence[torch.Tensor], start: Sequence[torch.Tensor],
                end: Sequence[torch.Tensor], *, steps: int, lr: float) -> list[torch.Tensor]:
    """Option II: ``c_i^+ = c_i − c + (x − y) / (K η)`` from the received ``x`` and the trained ``y``."""
    return [cl - cg + (x0 - p.detach()) / (steps * lr) for cl, cg, x0, p in zip(c_local, c_global, start, end)]


def scaffold_server_update(
    x: torch.Tensor, c: torch.Tensor, delta_y: torch.Tensor, delta_c: torch.Tensor, num_clients: int, lr_global: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x += η_g mean_i Δy_i``, ``c += (|S| / N) mean_i Δc_i`` (flat vectors; rows = participants)."""
    m = delta_y.shape[0]
    return x + lr_global * delta_y.mean(0), c + (m / num_clients) * delta_c.mean(0)
