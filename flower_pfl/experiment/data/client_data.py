"""One client's local data: its own train, validation and test parts, and how a client's share is split into them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class ClientData:
    """A client's train and test parts (``x`` float32, or int64 token ids; ``y`` int64 labels), the
    natural group or domain its data come from (``""``: none; the writer, speaking role, subject or
    digit data set) and, with ``val-fraction``, its validation part (``None``: none)."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    group: str = ""
    x_val: torch.Tensor | None = None
    y_val: torch.Tensor | None = None

    @property
    def num_train(self) -> int:
        return len(self.y_train)

    @property
    def has_validation(self) -> bool:
        return self.y_val is not None and len(self.y_val) > 0

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor it holds."""
        return [t for t in (self.x_train, self.y_train, self.x_test, self.y_test, self.x_val, self.y_val) if t is not None]

    def to(self, device: torch.device) -> ClientData:
        """A copy on ``device``."""
        val = (self.x_val, self.y_val) if self.x_val is not None and self.y_val is not None else None
        return ClientData(self.x_train.to(device), self.y_train.to(device), self.x_test.to(device), self.y_test.to(device),
                          self.group, *((val[0].to(device), val[1].to(device)) if val is not None else ()))


def split_indices(size: int, train_fraction: float, rng: np.random.Generator, temporal: bool = False,
                  gap: int = 0, min_test: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A client's train and test indices into its ``size`` samples, at least one on each side: a seeded
    shuffle cut at ``train_fraction``, or (``temporal``) the first samples for training and the test part
    starting ``gap`` samples after them (LEAF's split of overlapping windows of one text). With
    ``min_test``, the cut moves earlier where the fraction would leave fewer test samples than that (a
    client too small for it keeps what the fraction gives: ``smallest_share`` says which are)."""
    if not 0.0 < train_fraction < 1.0:
        raise ValueError(f"train_fraction must be in (0, 1), got {train_fraction}")
    if size < 2 + gap:
        raise ValueError(f"a client needs at least {2 + gap} samples to split into train and test")
    if temporal:
        cut = min(max(min(int(train_fraction * size), size - gap - min_test), 1), size - 1 - gap)
        return np.arange(cut), np.arange(cut + gap, size)
    perm = rng.permutation(size)
    cut = min(max(min(int(round(train_fraction * size)), size - min_test), 1), size - 1)
    return perm[:cut], perm[cut:]


def validation_indices(train: np.ndarray, size: int, val_fraction: float, rng: np.random.Generator,
                       temporal: bool = False, gap: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A client's validation part taken out of its training part ``train`` (indices into its ``size``
    samples; the test part is left as it is): ``round(val_fraction · size)`` samples, at least one, and at
    least one left for training; a seeded draw, or (``temporal``) the training part's last samples, ``gap``
    samples after the rest (as the test part follows the training part). Returns ``(train, validation)``;
    ``val_fraction = 0``: no validation part, ``train`` as it is."""
    if val_fraction <= 0:
        return train, train[:0]
    spare = len(train) - 1 - (gap if temporal else 0)
    if spare < 1:
        raise ValueError(f"a client with {len(train)} training sample(s) has none to spare for validation")
    n = min(max(int(round(val_fraction * size)), 1), spare)
    if temporal:
        return train[:len(train) - n - gap], train[len(train) - n:]
    held = np.zeros(len(train), dtype=bool)
    held[rng.choice(len(train), size=n, replace=False)] = True
    return train[~held], train[held]


def smallest_share(min_test: int, gap: int = 0) -> int:
    """The fewest samples a client needs for ``split_indices`` (with ``min_test``) to leave it at least
    ``min_test`` test samples and one training sample."""
    return max(2 + gap, 1 + gap + min_test)


def train_test_split(x: np.ndarray, y: np.ndarray, train_fraction: float, rng: np.random.Generator) -> ClientData:
    """Float features: a seeded shuffle, then the first ``train_fraction`` for training (``split_indices``)."""
    tr, te = split_indices(len(y), train_fraction, rng)
    as_x = lambda a: torch.as_tensor(a, dtype=torch.float32)
    as_y = lambda a: torch.as_tensor(a, dtype=torch.int64)
    return ClientData(as_x(x[tr]), as_y(y[tr]), as_x(x[te]), as_y(y[te]))
