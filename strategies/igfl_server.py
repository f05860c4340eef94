"""IGFL's server side, shared by the legacy and Message-API strategies.

The server keeps the global model's last update ``Δw_ps`` (sent to clients for
IGFL-C) and every client's previous delta ``Δw_i^r`` (the query of time attention),
and aggregates a round's deltas with AFL (Algorithm 3) or their plain mean.
"""

from __future__ import annotations

from typing import Hashable, Mapping, Sequence

import numpy as np
import torch

from flower_pfl.diagnostics import AttentionAccumulator
from flower_pfl.layout import ParamLayout
from flower_pfl.methods.igfl import ATTENTION_MODES, CORRECTION, GLOBAL_DELTA, PARTICIPANTS, afl_global_delta, encode_vector

class IGFLServer:
    """``attention``: ``"self"``, ``"global"``, ``"time"`` (IGFL-S / AFL) or ``None`` (plain mean of
    the deltas); ``client_correction``: clients run IGFL-C instead of plain local SGD."""

    def __init__(self, attention: str | None = "self", client_correction: bool = True) -> None:
        if attention is not None and attention not in ATTENTION_MODES:
            raise ValueError(f"attention must be one of {ATTENTION_MODES} or None, got {attention!r}")
        self.attention = attention
        self.client_correction = client_correction
        self.layout: ParamLayout | None = None
        self.global_model: torch.Tensor | None = None
        self.global_delta: torch.Tensor | None = None
        self.previous: dict[Hashable, torch.Tensor] = {}
        #: self-attention weights, averaged over the rounds each pair met in (diagnostics)
        self.attention_record = AttentionAccumulator()

    def initialize(self, arrays: Mapping[str, np.ndarray]) -> None:
        if self.layout is None:
            self.layout = ParamLayout.from_arrays(arrays)
            self.global_delta = torch.zeros(self.layout.dim)

    def begin_round(self, global_arrays: Sequence[np.ndarray]) -> None:
        """Remember the global model this round's participants start from."""
        assert self.layout is not None, "initialize() first"
        self.global_model = self.layout.flatten(global_arrays)

    def instructions(self, num_participants: int) -> dict[str, bool | int | bytes]:
        """Config entries for this round's participants (``Δw_ps`` is zero before the first update)."""
        assert self.global_delta is not None, "initialize() first"
        return {CORRECTION: self.client_correction, PARTICIPANTS: num_participants,
                GLOBAL_DELTA: encode_vector(self.global_delta)}

    def aggregate(self, ids: Sequence[Hashable], models: Sequence[torch.Tensor]) -> torch.Tensor:
        """The new global model from the participants' returned models (Algorithm 3, line 7)."""
        global_model = self.global_model
        deltas = torch.stack(list(models)) - global_model
        if self.attention is None:
            update = deltas.mean(0)
        else:
            previous = torch.stack([self.previous.get(cid, torch.zeros_like(global_model)) for cid in ids])
            update, weights = afl_global_delta(deltas, previous, self.attention)  # type: ignore[arg-type]
            if self.attention == "self":
                self.attention_record.add(ids, {"model": weights})
        self.previous.update(zip(ids, deltas))
        self.global_delta = update
        return global_model + update
