"""Pieces of local training and evaluation: fresh minibatches, parameter helpers, evaluation
(the loop itself is ``flower_pfl.client_step.train_locally``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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


@dataclass(frozen=True)
class LocalResult:
    """Mean training loss (data term only) over the steps taken."""

    loss: float
    steps: int


def trainable(model: nn.Module) -> list[torch.Tensor]:
    return [p for p in model.parameters() if p.requires_grad]


def like_params(tensors: Sequence[torch.Tensor], params: Sequence[torch.Tensor], what: str) -> list[torch.Tensor]:
    """``tensors`` on the parameters' device and dtype, checked to have the parameters' shapes."""
    if [tuple(t.shape) for t in tensors] != [tuple(p.shape) for p in params]:
        raise ValueError(f"the {what} must have the shapes of the model's parameters")
    return [t.to(device=p.device, dtype=p.dtype) for t, p in zip(tensors, params)]


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
