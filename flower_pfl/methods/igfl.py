"""IGFL (Huang, Shang et al.; paper 002): individual-and-group client correction (IGFL-C,
Algorithm 2) and attention-based server aggregation (AFL / IGFL-S, Algorithm 3).

Pure tensor functions; the deltas of a round's participants form one ``(m, d)`` matrix.
"""

from __future__ import annotations

from typing import Literal, Sequence

import torch
from torch import nn

from ..solvers import LocalResult, like_params, run_steps, trainable

AttentionMode = Literal["self", "global", "time"]
ATTENTION_MODES: tuple[str, ...] = ("self", "global", "time")

#: config keys of IGFL's training instructions: run IGFL-C, |S|, and Δw_ps as float32 bytes
CORRECTION, PARTICIPANTS, GLOBAL_DELTA = "igfl-correction", "igfl-participants", "igfl-global-delta"


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


def igfl_local_sgd(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    steps: int,
    lr: float,
    batch_size: int,
    previous_delta: Sequence[torch.Tensor] | None,
    global_delta: Sequence[torch.Tensor] | None,
    num_participants: int,
    generator: torch.Generator,
) -> LocalResult:
    """IGFL-C (Algorithm 2, lines 3-7): ``T`` corrected steps, in place.

    Per step: ``Δ_I = -η g_i(w)``, ``Δ_G = (Δ_I - Δw_i^r / T) / |S| + Δw_ps / T``,
    ``w <- w + Δ_I + Δ_G``. ``previous_delta`` is the client's own last delta ``Δw_i^r``
    and ``global_delta`` the server's last global delta ``Δw_ps``; ``None`` means zero
    (a client's first participation, Algorithm 1's ``Δw_k^0 = 0``; the first round).
    With ``|S| = 1`` and zero deltas this is plain SGD with step ``2η``.
    """
    if num_participants < 1:
        raise ValueError("num_participants must be >= 1")
    params = trainable(model)
    zeros = [torch.zeros_like(p) for p in params]
    prev = zeros if previous_delta is None else like_params(previous_delta, params, "previous delta")
    glob = zeros if global_delta is None else like_params(global_delta, params, "global delta")

    def step(ps: list[torch.Tensor], grads: Sequence[torch.Tensor]) -> None:
        for p, g, dp, dg in zip(ps, grads, prev, glob):
            p.add_(corrected_step(g, dp, dg, lr=lr, steps=steps, num_participants=num_participants))

    return run_steps(model, x, y, steps=steps, batch_size=batch_size, generator=generator, update=step)
