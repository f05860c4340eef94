"""One client's local data: its own train and test parts."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class ClientData:
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor

    @property
    def num_train(self) -> int:
        return len(self.y_train)


def train_test_split(x: np.ndarray, y: np.ndarray, train_fraction: float, rng: np.random.Generator) -> ClientData:
    """Seeded shuffle, then the first ``train_fraction`` for training (at least one sample each side)."""
    if not 0.0 < train_fraction < 1.0:
        raise ValueError(f"train_fraction must be in (0, 1), got {train_fraction}")
    if len(y) < 2:
        raise ValueError("a client needs at least 2 samples to split into train and test")
    perm = rng.permutation(len(y))
    cut = min(max(int(round(train_fraction * len(y))), 1), len(y) - 1)
    tr, te = perm[:cut], perm[cut:]
    as_x = lambda a: torch.as_tensor(a, dtype=torch.float32)
    as_y = lambda a: torch.as_tensor(a, dtype=torch.int64)
    return ClientData(as_x(x[tr]), as_y(y[tr]), as_x(x[te]), as_y(y[te]))
