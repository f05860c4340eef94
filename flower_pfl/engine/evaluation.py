"""A client's evaluation of a model on its own test split (mean cross-entropy and accuracy)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


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
