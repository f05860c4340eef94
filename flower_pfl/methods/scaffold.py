"""SCAFFOLD (Karimireddy et al. 2020), option II: control variates correct client drift."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from flower_pfl.engine.client_algorithm import (
    Batch,
    ClientAlgorithm,
    ClientState,
    LossFn,
    keep,
    like_params,
    over_state,
    setting,
    stored,
    trainable,
    trainable_part,
)
from flower_pfl.engine.params import POSITIVE, param
from flower_pfl.engine.reply_checks import AlgorithmOutputMissing, Reply, norm
from flower_pfl.engine.server_algorithm import GlobalModelAlgorithm, Settings
from flower_pfl.engine.wire import decode_flat, encode_vector
from flower_pfl.methods.base import Method

#: config key of the server's control variate ``c``; reply key of the client's ``Δc_i`` (float32 bytes)
CONTROL, CONTROL_DELTA = "scaffold-control", "scaffold-control-delta"
#: client-state key of the client's control variate ``c_i``
CONTROL_STATE = "scaffold-control"


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


class ScaffoldCorrection(ClientAlgorithm):
    """SCAFFOLD's client, option II: ``K`` steps with gradient ``g + c − c_i`` from the received ``x``;
    ``finish`` sets ``c_i ← c_i − c + (x − y) / (K η)`` (client state; zero before the first
    participation) and returns ``Δc_i`` as ``scaffold-control-delta``."""

    keeps_state = True
    name = "scaffold"
    batched_state = ("c_global", "c_local")
    needs_state = needs_plain_sgd = True
    reply_keys = (CONTROL_DELTA,)

    def __init__(self, model: nn.Module, config: Mapping[str, Any], state: ClientState | None = None,
                 loss_fn: LossFn = F.cross_entropy) -> None:
        super().__init__(model, config, state, loss_fn)
        c = trainable_part(model, setting(config, CONTROL, "SCAFFOLD"))  # the server's c spans the whole flat model
        self.c_global = like_params(c, self.received, "global control variate")
        ci = stored(state, CONTROL_STATE)
        self.c_local = [torch.zeros_like(r) for r in self.received] if ci is None else like_params(ci, self.received, "control variate")


    def gradient_terms(self, params: Sequence[torch.Tensor], batch: Batch | None) -> Sequence[torch.Tensor | None]:
        return [cg - cl for cg, cl in zip(self.c_global, self.c_local)]

    def end_round(self, model: nn.Module, inputs: Any = None) -> dict[str, bytes]:
        if self.steps < 1:
            raise ValueError("SCAFFOLD's control variate needs at least one step")
        new = new_control(self.c_local, self.c_global, self.received, trainable(model), steps=self.steps, lr=self.lr)
        keep(self.state, CONTROL_STATE, new)
        return {CONTROL_DELTA: encode_vector(over_state(model, [n - o for n, o in zip(new, self.c_local)]))}


@dataclass
class SCAFFOLD(Method, GlobalModelAlgorithm):
    """SCAFFOLD (Karimireddy et al. 2020), option II: the server sends its control variate ``c``
    (``scaffold-control``, float32 bytes); each client keeps its ``c_i``, steps with ``g + c − c_i``
    and returns ``Δc_i``. Server: ``x += η_g mean Δy_i``, ``c += (|S|/N) mean Δc_i`` with ``N`` the
    connected clients."""

    name = "scaffold"
    strategy = "SCAFFOLD"
    client = ScaffoldCorrection
    state_attributes = ("control",)

    server_learning_rate: float = param(1.0, must=POSITIVE, doc="global step size η_g (1 in the paper's experiments)")
    control: torch.Tensor | None = field(default=None, init=False, repr=False)

    def setup(self, layout: Any, initial: torch.Tensor, device: torch.device, seed: int = 0) -> None:
        super().setup(layout, initial, device, seed)
        self.control = torch.zeros(layout.dim)

    def train_config(self, num_participants: int) -> Settings:
        return {CONTROL: encode_vector(self.control)}  # type: ignore[arg-type]

    def check_extras(self, extras: Mapping[str, Any]) -> torch.Tensor:
        """The client's ``Δc_i``: float32 bytes of the model's size, all finite."""
        if CONTROL_DELTA not in extras:
            raise AlgorithmOutputMissing(f"the reply lacks '{CONTROL_DELTA}' (SCAFFOLD's Δc_i)", ScaffoldCorrection.__name__)
        delta = decode_flat(extras[CONTROL_DELTA], self.layout.dim, CONTROL_DELTA)
        if not torch.isfinite(delta).all():
            raise ValueError(f"'{CONTROL_DELTA}' holds NaN or Inf")
        return delta

    def example_extras(self, generator: torch.Generator) -> dict[str, bytes]:
        return {CONTROL_DELTA: encode_vector(0.01 * torch.randn(self.layout.dim, generator=generator))}

    def update_norms(self, reply: Reply, sent: torch.Tensor) -> dict[str, tuple[float, float]]:
        """The model's change, and ``Δc_i`` against the round's median."""
        return {**super().update_norms(reply, sent), CONTROL_DELTA: (norm(reply.extras), 0.0)}

    def combine(self, replies: Sequence[Reply]) -> torch.Tensor:
        delta_y = torch.stack([r.model for r in replies]).sub_(self.model)
        new_x, self.control = scaffold_server_update(self.model, self.control, delta_y, torch.stack([r.extras for r in replies]),  # type: ignore[arg-type]
                                                     max(self.num_clients, len(replies)), self.server_learning_rate)
        return new_x
