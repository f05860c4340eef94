"""The user's own model, data and training loop (as in ``legacy_app``), with one hook in the loop
for the method's client-side algorithm."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from flower_pfl.engine.client_algorithm import ClientAlgorithm

DIM, CLASSES = 10, 4


def Net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(DIM, 32), nn.ReLU(), nn.Linear(32, CLASSES))


def load_data(partition_id: int, num_partitions: int, n: int = 200) -> tuple[torch.Tensor, ...]:
    """Shared clusters, but every other client names the classes the other way round: a task
    where one global model cannot fit everyone and personalization pays."""
    rng = np.random.default_rng(partition_id)
    centers = np.random.default_rng(1234).normal(0, 2, (CLASSES, DIM))
    y = rng.integers(0, CLASSES, n)
    x = centers[y] + rng.normal(0, 1, (n, DIM))
    y = (CLASSES - 1 - y) if partition_id % 2 else y
    x, y = torch.tensor(x, dtype=torch.float32), torch.tensor(y)
    cut = int(0.75 * n)
    return x[:cut], y[:cut], x[cut:], y[cut:]


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, lr: float, steps: int, algorithm: ClientAlgorithm) -> float:
    """Plain minibatch SGD, plus ``algorithm.adjust_gradients`` between ``backward`` and ``step``."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16, shuffle=True)
    total, batches = 0.0, iter(())
    for _ in range(steps):
        try:
            xb, yb = next(batches)
        except StopIteration:
            batches = iter(loader)
            xb, yb = next(batches)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        algorithm.adjust_gradients(model, (xb, yb))  # the one added line (a no-op for plain local training)
        optimizer.step()
        total += float(loss)
    return total / steps


@torch.no_grad()
def test(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    logits = model(x)
    return float(F.cross_entropy(logits, y)), float((logits.argmax(1) == y).float().mean())
