"""A client's evaluation of a model on its own test split (mean cross-entropy and accuracy): one client's
(``evaluate``), or a round's clients' models on their own test splits as one computation
(``evaluate_together``: one ``torch.func.vmap`` of the model's forward pass per chunk of samples)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import vmap

from flower_pfl.engine.functional import Functional


@dataclass(frozen=True)
class EvalResult:
    loss: float
    accuracy: float
    num_examples: int


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 4096) -> EvalResult:
    """Mean cross-entropy and accuracy of ``model`` on ``(x, y)``."""
    model.eval()
    loss, correct = 0.0, 0
    for start in range(0, len(y), batch_size):
        logits = model(x[start : start + batch_size])
        target = y[start : start + batch_size]
        loss += float(F.cross_entropy(logits, target, reduction="sum"))
        correct += int((logits.argmax(1) == target).sum())
    n = len(y)
    return EvalResult(loss=loss / max(n, 1), accuracy=correct / max(n, 1), num_examples=n)


@torch.no_grad()
def evaluate_together(model: nn.Module, states: Sequence[Sequence[torch.Tensor]],
                      tests: Sequence[tuple[torch.Tensor, torch.Tensor]], batch_size: int = 4096) -> list[EvalResult]:
    """``evaluate`` of each client's model (``states[i]``: its ``state_dict``'s tensors, on ``model``'s
    architecture) on its own test split ``tests[i]``, the clients as one computation: each step runs every
    client's model on its next chunk of samples (``batch_size`` samples in all), the shorter splits padded
    with their first sample and the padding left out of the sums."""
    if not states:
        return []
    f, clients = Functional(model), len(states)
    model.eval()
    stacked = [torch.stack(list(ts)) for ts in zip(*states)]
    sizes = [len(y) for _, y in tests]
    chunk = max(1, batch_size // clients)
    device = tests[0][1].device
    losses = torch.zeros(clients, dtype=torch.float64, device=device)
    correct = torch.zeros(clients, dtype=torch.int64, device=device)
    forward = vmap(f)
    for start in range(0, max(sizes), chunk):
        rows = torch.arange(start, start + chunk, device=device)
        picks = [torch.where(rows < n, rows, 0) if n else rows.new_zeros(chunk) for n in sizes]
        keep = torch.stack([rows < n for n in sizes])
        x = torch.stack([xt[p] if n else xt.new_zeros((chunk, *xt.shape[1:])) for (xt, _), p, n in zip(tests, picks, sizes)])
        y = torch.stack([yt[p] if n else yt.new_zeros(chunk) for (_, yt), p, n in zip(tests, picks, sizes)])
        logits = forward(stacked, x)
        each = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(clients, chunk)
        losses += torch.where(keep, each, 0).sum(1).to(torch.float64)
        correct += ((logits.argmax(-1) == y) & keep).sum(1)
    return [EvalResult(loss=float(loss) / max(n, 1), accuracy=int(c) / max(n, 1), num_examples=n)
            for loss, c, n in zip(losses.cpu(), correct.cpu(), sizes)]
