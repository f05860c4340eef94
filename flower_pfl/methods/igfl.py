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
    Scores are dot products ``ψ(q, Δw) = <q, Δw>`` under a softmax that subtracts the row maximum,
    so whole-model dot products of any size are safe.

    - ``self`` (§4.1): ``α_ij = softmax_j <Δw_i, Δw_j>``, ``Δŵ_i = Σ_j α_ij Δw_j``, update = mean_i Δŵ_i.
    - ``global`` (§4.2): ``α_j = softmax_j <Δw_ps^{r+1}, Δw_j>`` with ``Δw_ps^{r+1}`` the mean delta,
      update = ``Σ_j α_j Δw_j``.
    - ``time`` (§4.3, its explicit equation): ``α_j = softmax_j <Δw_j^r, Δw_j^{r+1}>``, each client
      scored by how its update agrees with its own previous one; update = ``Σ_j α_j Δw_j``.
      A client without a previous delta has ``Δw_j^r = 0`` (Algorithm 1's initialisation).

    Returns ``(update, weights)``; ``weights`` is ``(m, m)`` for ``self``, ``(m,)`` otherwise.
    With equal deltas every mode gives their mean, i.e. FedAvg.
    """
    if mode == "self":
        weights = torch.softmax(deltas @ deltas.T, dim=1)
        return (weights @ deltas).mean(0), weights
    if mode == "global":
        weights = torch.softmax(deltas @ deltas.mean(0), dim=0)
    elif mode == "time":
        if previous is None or previous.shape != deltas.shape:
            raise ValueError("time attention needs the participants' previous deltas, shaped like their deltas")
        weights = torch.softmax((previous * deltas).sum(1), dim=0)
    else:
        raise ValueError(f"mode must be one of {ATTENTION_MODES}, got {mode!r}")
    return weights @ deltas, weights


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
            delta_i = -lr * g
            p.add_(delta_i + (delta_i - dp / steps) / num_participants + dg / steps)

    return run_steps(model, x, y, steps=steps, batch_size=batch_size, generator=generator, update=step)
