"""IGFL's server side: AFL aggregation (Algorithm 3) and the global delta sent for IGFL-C.

The server keeps the global model's last update ``Δw_ps`` (sent to clients for
IGFL-C) and every client's previous delta ``Δw_i^r`` (the query of time attention).
"""

from __future__ import annotations

from typing import Any, Hashable, Sequence

import torch

from flower_pfl.methods.igfl import ATTENTION_MODES, CORRECTION, GLOBAL_DELTA, PARTICIPANTS, afl_global_delta
from flower_pfl.wire import encode_vector

from .global_server import GlobalServer


class IGFLServer(GlobalServer):
    """``attention``: ``"self"``, ``"global"``, ``"time"`` (IGFL-S / AFL) or ``None`` (plain mean of
    the deltas); ``client_correction``: clients run IGFL-C instead of plain local SGD."""

    def __init__(self, attention: str | None = "self", client_correction: bool = True) -> None:
        super().__init__()
        if attention is not None and attention not in ATTENTION_MODES:
            raise ValueError(f"attention must be one of {ATTENTION_MODES} or None, got {attention!r}")
        self.attention_mode = attention
        self.client_correction = client_correction
        self.global_delta: torch.Tensor | None = None
        self.previous: dict[Hashable, torch.Tensor] = {}

    def on_initialize(self) -> None:
        self.global_delta = torch.zeros(self.layout.dim)  # type: ignore[union-attr]

    def instructions(self, num_participants: int) -> dict[str, Any]:
        """IGFL-C's inputs (``Δw_ps`` is zero before the first update)."""
        assert self.global_delta is not None, "initialize() first"
        return {CORRECTION: self.client_correction, PARTICIPANTS: num_participants,
                GLOBAL_DELTA: encode_vector(self.global_delta)}

    def aggregate(self, ids: Sequence[Hashable], models: Sequence[torch.Tensor], payloads: Sequence[Any] = (),
                  num_examples: Sequence[int] = ()) -> torch.Tensor:
        """Algorithm 3, line 7: ``w_ps + Δ`` with ``Δ`` the attention-weighted (or mean) delta."""
        global_model = self.global_model
        assert global_model is not None, "begin_round() first"
        deltas = torch.stack(list(models)) - global_model
        if self.attention_mode is None:
            update = deltas.mean(0)
        else:
            previous = torch.stack([self.previous.get(cid, torch.zeros_like(global_model)) for cid in ids])
            update, weights = afl_global_delta(deltas, previous, self.attention_mode)  # type: ignore[arg-type]
            if weights.dim() == 2:  # client-by-client attention (self, time)
                self.attention.add(ids, {"model": weights})
        self.previous.update(zip(ids, deltas))
        self.global_delta = update
        return global_model + update
