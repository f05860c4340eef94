"""The app's own model, data and plain-SGD training loop.

Every client sees 8x8 images of four bar patterns; half of the clients name the patterns the other
way round, so one model cannot serve everyone and a personalized one pays.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

SIDE, CLASSES = 8, 4


def Net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(SIDE * SIDE, 16), nn.ReLU(), nn.Linear(16, CLASSES))


def _patterns() -> np.ndarray:
    """Horizontal, vertical and the two diagonal bars through the image centre."""
    img = np.zeros((CLASSES, SIDE, SIDE), dtype=np.float32)
    mid, idx = SIDE // 2, np.arange(SIDE)
    img[0, mid, :] = img[1, :, mid] = img[2, idx, idx] = img[3, idx, SIDE - 1 - idx] = 1.0
    return img


def load_data(partition_id: int, n: int = 160) -> tuple[torch.Tensor, ...]:
    """``(x_train, y_train, x_test, y_test)`` of one client: noisy patterns, 3/4 for training."""
    rng = np.random.default_rng(100 + partition_id)
    y = rng.integers(0, CLASSES, n)
    x = _patterns()[y] + rng.normal(0, 0.6, (n, SIDE, SIDE)).astype(np.float32)
    if partition_id % 2:
        y = (y + 1) % CLASSES
    cut = 3 * n // 4
    x_t, y_t = torch.from_numpy(x), torch.from_numpy(y)
    return x_t[:cut], y_t[:cut], x_t[cut:], y_t[cut:]


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, lr: float, steps: int) -> float:
    """Plain minibatch SGD; the mean training loss."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(int(y.sum()))
    total = 0.0
    for _ in range(steps):
        idx = torch.randint(len(y), (16,), generator=gen)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        optimizer.step()
        total += loss.item()
    return total / steps


@torch.no_grad()
def test(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    logits = model(x)
    return float(F.cross_entropy(logits, y)), float((logits.argmax(1) == y).float().mean())
