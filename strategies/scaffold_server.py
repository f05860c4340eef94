"""SCAFFOLD's server side (Karimireddy et al. 2020, Algorithm 1, option II): the global model
``x`` and control variate ``c``; clients keep their own ``c_i`` and return ``Δc_i``."""

from __future__ import annotations

from typing import Any, Hashable, Mapping, Sequence

import torch

from flower_pfl.methods.scaffold import CONTROL, CONTROL_DELTA, scaffold_server_update
from flower_pfl.wire import decode_flat, encode_vector

from .global_server import GlobalServer


class ScaffoldServer(GlobalServer):
    """``server_learning_rate``: the global step size ``η_g`` (1 in the paper's experiments)."""

    def __init__(self, server_learning_rate: float = 1.0) -> None:
        super().__init__()
        if server_learning_rate <= 0:
            raise ValueError(f"server_learning_rate must be > 0, got {server_learning_rate}")
        self.server_learning_rate = server_learning_rate
        self.control: torch.Tensor | None = None

    def on_initialize(self) -> None:
        self.control = torch.zeros(self.layout.dim)  # type: ignore[union-attr]

    def instructions(self, num_participants: int) -> dict[str, Any]:
        assert self.control is not None, "initialize() first"
        return {CONTROL: encode_vector(self.control)}

    def check_payload(self, payload: Mapping[str, Any]) -> torch.Tensor:
        """The client's ``Δc_i``: float32 bytes of the model's size, all finite."""
        if CONTROL_DELTA not in payload:
            raise ValueError(f"the reply lacks '{CONTROL_DELTA}' (SCAFFOLD's Δc_i)")
        delta = decode_flat(payload[CONTROL_DELTA], self.layout.dim)  # type: ignore[union-attr]
        if not torch.isfinite(delta).all():
            raise ValueError(f"'{CONTROL_DELTA}' holds NaN or Inf")
        return delta

    def aggregate(self, ids: Sequence[Hashable], models: Sequence[torch.Tensor], payloads: Sequence[Any],
                  num_examples: Sequence[int] = ()) -> torch.Tensor:
        """``x += η_g mean Δy_i``, ``c += |S|/N mean Δc_i`` with ``N`` the connected clients."""
        assert self.global_model is not None and self.control is not None, "begin_round() first"
        delta_y = torch.stack(list(models)) - self.global_model
        new_x, self.control = scaffold_server_update(self.global_model, self.control, delta_y, torch.stack(list(payloads)),
                                                     max(self.num_clients, len(ids)), self.server_learning_rate)
        return new_x
