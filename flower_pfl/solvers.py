"""Local solvers: what a client does with the model it receives in a round."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn


class MinibatchStream:
    """Endless stream of fresh minibatch indices: a seeded shuffle, reshuffled when used up.

    Every ``next()`` returns ``batch_size`` indices not used since the last reshuffle
    (the remainder of an epoch that is too short for a full batch is skipped).
    A data set smaller than ``batch_size`` yields all of its indices every time.
    """

    def __init__(self, n: int, batch_size: int, generator: torch.Generator) -> None:
        if n <= 0 or batch_size <= 0:
            raise ValueError("n and batch_size must be positive")
        self.n, self.batch_size, self.generator = n, min(batch_size, n), generator
        self._perm = torch.randperm(n, generator=generator)
        self._pos = 0

    def next(self) -> torch.Tensor:
        if self._pos + self.batch_size > self.n:
            self._perm = torch.randperm(self.n, generator=self.generator)
            self._pos = 0
        idx = self._perm[self._pos : self._pos + self.batch_size]
        self._pos += self.batch_size
        return idx


def proximal_term(params: Sequence[torch.Tensor], anchor: Sequence[torch.Tensor]) -> torch.Tensor:
    """``0.5 * ||params - anchor||^2`` summed over all tensors (anchor is a constant)."""
    return 0.5 * sum(((p - a.detach()) ** 2).sum() for p, a in zip(params, anchor))


@dataclass(frozen=True)
class LocalResult:
    """Mean training loss (data term only) over the steps taken."""

    loss: float
    steps: int


def local_sgd(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    steps: int,
    lr: float,
    batch_size: int,
    prox_mu: float = 0.0,
    anchor: Sequence[torch.Tensor] | None = None,
    generator: torch.Generator,
) -> LocalResult:
    """``steps`` SGD steps on fresh minibatches of ``min f_i(w) + mu/2 ||w - a||^2``.

    The anchor ``a`` (default: the model as received) stays fixed for the whole
    round: FedMCSA's client problem (paper 004, eq. 9, Algorithm 1 lines 13-18)
    and FedProx's. ``prox_mu = 0`` is plain local SGD. The model is updated in place.
    """
    if prox_mu < 0:
        raise ValueError(f"prox_mu must be >= 0, got {prox_mu}")
    params = [p for p in model.parameters() if p.requires_grad]
    anchor = [p.detach().clone() for p in params] if anchor is None else [a.to(params[0].device) for a in anchor]
    if [tuple(a.shape) for a in anchor] != [tuple(p.shape) for p in params]:
        raise ValueError("the anchor must have the shapes of the model's parameters")
    stream = MinibatchStream(len(y), batch_size, generator)
    model.train()
    total = 0.0
    for _ in range(steps):
        idx = stream.next()
        data_loss = F.cross_entropy(model(x[idx]), y[idx])
        loss = data_loss + prox_mu * proximal_term(params, anchor) if prox_mu > 0 else data_loss
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads):
                p.add_(g, alpha=-lr)
        total += float(data_loss.detach())
    return LocalResult(loss=total / max(steps, 1), steps=steps)


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
