"""IGFL (Huang, Shang et al.): individual-and-group client correction (IGFL-C,
Algorithm 2) and attention-based server aggregation (AFL / IGFL-S, Algorithm 3).

The deltas of a round's participants form one ``(m, d)`` matrix.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from flower_pfl.engine.attention_log import AttentionAccumulator
from flower_pfl.engine.client_algorithm import (
    LOCAL_STEPS,
    Batch,
    ClientAlgorithm,
    ClientState,
    LossFn,
    keep,
    like_params,
    setting,
    stored,
    trainable,
    trainable_part,
)
from flower_pfl.engine.params import Rule, param
from flower_pfl.engine.reply_checks import Reply
from flower_pfl.engine.server_algorithm import GlobalModelAlgorithm, Settings
from flower_pfl.engine.wire import encode_vector
from flower_pfl.methods.base import Method, Variant

AttentionMode = Literal["self", "global", "time"]
ATTENTION_MODES: tuple[str, ...] = ("self", "global", "time")

#: config keys of IGFL-C's training instructions: |S|, and Δw_ps as float32 bytes
PARTICIPANTS, GLOBAL_DELTA = "igfl-participants", "igfl-global-delta"
#: client-state key of the client's last delta Δw_i^r
DELTA_STATE = "igfl-delta"


def afl_global_delta(deltas: torch.Tensor, previous: torch.Tensor | None, mode: AttentionMode) -> tuple[torch.Tensor, torch.Tensor]:
    """The server's global update ``w_ps^{r+1} - w_ps^r`` from the participants' deltas (Algorithm 3).

    ``deltas``: ``(m, d)`` rows ``Δw_j^{r+1}``; ``previous``: ``(m, d)`` rows ``Δw_j^r`` (time attention).
    Algorithm 3: ``α_ij = softmax_j ψ(q_i, Δw_j^{r+1})`` with ``ψ`` the dot product, ``Δŵ_i = Σ_j α_ij Δw_j``
    and update ``mean_i Δŵ_i = (mean_i α_i·) Δw``. The softmax subtracts the row maximum, so
    whole-model dot products of any size are safe. The query ``q_i``:

    - ``self`` (Option I, §4.1): ``Δw_i^{r+1}``, the client's own delta;
    - ``global`` (Option II, §4.2): ``Δw_ps^{r+1}``, the mean delta (one query: weights ``(m,)``);
    - ``time`` (Option III): ``Δw_i^r``, the client's previous delta, kept by the server; a client
      without one has ``Δw_i^r = 0`` (Algorithm 1's initialisation), i.e. a uniform row.
      (§4.3's displayed equation keeps only the diagonal ``α_jj`` of this matrix as ``α_j``;
      those weights need not sum to one, so Algorithm 3 is followed.)

    Returns ``(update, weights)``; ``weights`` is ``(m, m)`` for ``self`` and ``time``, ``(m,)`` for
    ``global``. With equal deltas every mode gives their mean, i.e. FedAvg.
    """
    if mode == "global":
        weights = torch.softmax(deltas @ deltas.mean(0), dim=0)
        return weights @ deltas, weights
    if mode == "self":
        queries = deltas
    elif mode == "time":
        if previous is None or previous.shape != deltas.shape:
            raise ValueError("time attention needs the participants' previous deltas, shaped like their deltas")
        queries = previous
    else:
        raise ValueError(f"mode must be one of {ATTENTION_MODES}, got {mode!r}")
    weights = torch.softmax(queries @ deltas.T, dim=1)
    return weights.mean(0) @ deltas, weights


def corrected_step(grad: torch.Tensor, previous_delta: torch.Tensor, global_delta: torch.Tensor, *,
                   lr: float, steps: int, num_participants: int) -> torch.Tensor:
    """IGFL-C's step ``Δ_I + Δ_G`` for one tensor (Algorithm 2, lines 5-6): ``Δ_I = −η g``,
    ``Δ_G = (Δ_I − Δw_i^r / T) / |S| + Δw_ps / T``."""
    delta_i = -lr * grad
    return delta_i + (delta_i - previous_delta / steps) / num_participants + global_delta / steps


class IGFLCorrection(ClientAlgorithm):
    """IGFL-C (Algorithm 2, lines 3-7): exactly ``local-steps`` steps, each ``w ← w + Δ_I + Δ_G``,
    realised as the gradient whose plain SGD step of size ``lr`` is ``Δ_I + Δ_G``. ``Δw_i^r`` is the
    client's own last delta (client state; zero on its first participation), ``Δw_ps`` the server's
    last global delta (sent as ``igfl-global-delta``). With ``|S| = 1`` and zero deltas this is plain
    SGD with step ``2η``. ``finish`` keeps the new delta ``w^{r,T} − w_ps^r``."""

    keeps_state = True
    name = "igfl"
    batched_state = ("previous", "global_delta")
    needs_state = needs_plain_sgd = True

    def __init__(self, model: nn.Module, config: Mapping[str, Any], state: ClientState | None = None,
                 loss_fn: LossFn = F.cross_entropy) -> None:
        super().__init__(model, config, state, loss_fn)
        prev = stored(state, DELTA_STATE)
        self.previous = [torch.zeros_like(r) for r in self.received] if prev is None else like_params(prev, self.received, "last delta")
        self.global_delta = like_params(trainable_part(model, setting(config, GLOBAL_DELTA, "IGFL-C")), self.received,
                                        "global delta")  # the server's Δw_ps spans the whole flat model
        self.participants = int(setting(config, PARTICIPANTS, "IGFL-C"))
        self.total_steps = int(setting(config, LOCAL_STEPS, "IGFL-C"))
        if self.participants < 1:
            raise ValueError("IGFL-C needs igfl-participants >= 1")


    def gradients(self, params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor | None],
                  batch: Batch | None) -> list[torch.Tensor | None]:
        lr = self.lr
        return [-corrected_step(g if g is not None else torch.zeros_like(p), dp, dg, lr=lr, steps=self.total_steps,
                                num_participants=self.participants) / lr
                for p, g, dp, dg in zip(params, grads, self.previous, self.global_delta)]

    def end_round(self, model: nn.Module, inputs: Any = None) -> dict[str, bytes]:
        if self.steps != self.total_steps:
            raise ValueError(f"IGFL-C's correction assumes local-steps = {self.total_steps} steps; {self.steps} were taken")
        keep(self.state, DELTA_STATE, [p.detach() - r for p, r in zip(trainable(model), self.received)])
        return {}


@dataclass
class IGFL(Method, GlobalModelAlgorithm):
    """IGFL (Huang, Shang et al.): one global model; clients run IGFL-C (Algorithm 2) and the server
    aggregates their deltas with attention (AFL, Algorithm 3).

    The server keeps the global model's last update ``Δw_ps`` (sent for IGFL-C as
    ``igfl-global-delta``) and every client's previous delta ``Δw_i^r`` (the query of time
    attention). ``igfl-c`` averages the deltas (no attention); ``igfl-s`` has plain local SGD clients.
    """

    name = "igfl"
    strategy = "IGFL"
    client = IGFLCorrection
    group = "paper"
    variants = (Variant("igfl-c", fixed={"attention": None}), Variant("igfl-s", fixed={"client_correction": False}))
    state_attributes = ("global_delta", "previous", "attention_weights")

    attention: str | None = param("self", key="igfl-attention",
                                  must=Rule(lambda v: v is None or v in ATTENTION_MODES, "one of self, global, time"),
                                  doc="query of the server's attention: 'self', 'global', 'time', or None (the plain mean of the deltas, IGFL-C alone)")
    client_correction: bool = param(True, doc="clients run IGFL-C (False: plain local SGD, IGFL-S alone)")
    def setup(self, layout: Any, initial: torch.Tensor, device: torch.device, seed: int = 0) -> None:
        super().setup(layout, initial, device, seed)
        #: the server's last global delta Δw_ps and every client's previous delta Δw_i^r
        self.global_delta = torch.zeros(layout.dim)
        self.previous: dict[Hashable, torch.Tensor] = {}
        #: client-level attention weights averaged over rounds (self and time attention)
        self.attention_weights = AttentionAccumulator()

    def client_algorithm(self) -> type[ClientAlgorithm]:
        """IGFL-C, or plain local SGD for IGFL-S (``client_correction = False``)."""
        return self.client if self.client_correction else ClientAlgorithm

    def ignored_algorithm_consequence(self, algorithm: type[ClientAlgorithm]) -> str:
        """Without IGFL-C, IGFL is IGFL-S; IGFL-C (no attention) is FedAvg."""
        if self.attention is None:
            return "runs as FedAvg (no IGFL-C client correction, no attention)"
        return "runs as IGFL-S (server attention only, no IGFL-C client correction)"

    def train_config(self, num_participants: int) -> Settings:
        """IGFL-C's inputs (``Δw_ps`` is zero before the first update); none for IGFL-S."""
        if not self.client_correction:
            return {}
        return {PARTICIPANTS: num_participants, GLOBAL_DELTA: encode_vector(self.global_delta)}

    def combine(self, replies: Sequence[Reply]) -> torch.Tensor:
        """Algorithm 3, line 7: ``w_ps + Δ`` with ``Δ`` the attention-weighted (or mean) delta."""
        ids = [r.client_id for r in replies]
        deltas = torch.stack([r.model for r in replies]).sub_(self.model)
        if self.attention is None:
            update = deltas.mean(0)
        else:
            previous = (torch.stack([self.previous.get(cid, torch.zeros_like(self.model)) for cid in ids])
                        if self.attention == "time" else None)  # only time attention queries with them
            update, weights = afl_global_delta(deltas, previous, self.attention)  # type: ignore[arg-type]
            if weights.dim() == 2:  # client-by-client attention (self, time)
                self.attention_weights.add(ids, {"model": weights})
        self.previous.update((cid, delta.clone()) for cid, delta in zip(ids, deltas))  # not views of the round's matrix
        self.global_delta = update
        return self.model + update
