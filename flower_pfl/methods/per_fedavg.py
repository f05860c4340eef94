"""Per-FedAvg (Fallah, Mokhtari, Ozdaglar 2020), first-order version: FedAvg trains a model that
adapts well after one local step; a client's personalized model is that one step."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..solvers import LocalResult, MinibatchStream, trainable

#: config keys: Per-FedAvg's client step (its alpha, the adaptation step size); evaluate after one step
ALPHA, ADAPT = "per-fedavg-alpha", "per-fedavg-adapt"


def _grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], float]:
    loss = F.cross_entropy(model(x), y)
    return torch.autograd.grad(loss, trainable(model)), float(loss.detach())


def per_fedavg_local_sgd(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, steps: int, alpha: float, beta: float,
                         batch_size: int, generator: torch.Generator) -> LocalResult:
    """``steps`` first-order MAML steps, in place: with fresh minibatches ``D``, ``D'``,
    ``w_tmp = w − α ∇f(w; D)``, then ``w ← w − β ∇f(w_tmp; D')``."""
    params = trainable(model)
    stream = MinibatchStream(len(y), batch_size, generator)
    model.train()
    total = 0.0
    for _ in range(steps):
        start = [p.detach().clone() for p in params]
        inner = stream.next()
        grads, loss = _grads(model, x[inner], y[inner])
        with torch.no_grad():
            for p, g in zip(params, grads):
                p.sub_(alpha * g)
        outer = stream.next()
        grads, _ = _grads(model, x[outer], y[outer])
        with torch.no_grad():
            for p, s, g in zip(params, start, grads):
                p.copy_(s - beta * g)
        total += loss
    return LocalResult(loss=total / max(steps, 1), steps=steps)


def adapt_one_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, alpha: float) -> None:
    """The personalized model: one gradient step of size ``alpha`` on the client's whole training
    split (never its test split), in place."""
    if len(y) == 0:
        return
    grads, _ = _grads(model, x, y)
    with torch.no_grad():
        for p, g in zip(trainable(model), grads):
            p.sub_(alpha * g)
