"""Functions a researcher might name in the run config (``dataset = "tests.own_cases:..."``, ``model =
"tests.own_cases:..."``): good ones and ones the package must refuse with a clear message."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


def features():
    """120 float samples of shape (2, 5), three classes, and a sensor id for each (four sensors)."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 120)
    return rng.normal(size=(120, 2, 5)).astype(np.float32) + y[:, None, None], y, [f"sensor{i % 4}" for i in range(120)]


def token_ids():
    rng = np.random.default_rng(1)
    return torch.as_tensor(rng.integers(0, 17, size=(40, 6))), torch.as_tensor(rng.integers(0, 2, 40))


def not_a_pair():
    return np.zeros((4, 2))


def float_labels():
    return np.zeros((4, 2), np.float32), np.array([0.0, 1.0, 0.5, 1.0])


def byte_images():
    return np.zeros((4, 1, 8, 8), np.uint8), np.array([0, 1, 0, 1])


def with_nan():
    x = np.zeros((4, 2), np.float32)
    x[1, 1] = np.nan
    return x, np.array([0, 1, 0, 1])


def ragged_labels():
    return np.zeros((4, 2), np.float32), np.array([0, 1, 0])


NOT_CALLABLE = 3


class Net(nn.Module):
    """A small network with its head named."""

    head_name = "out"

    def __init__(self, input_shape, num_classes):
        super().__init__()
        self.hidden = nn.Linear(int(np.prod(input_shape)), 8)
        self.out = nn.Linear(8, num_classes)

    def forward(self, x):
        return self.out(torch.relu(self.hidden(x.flatten(1))))


def net(input_shape, num_classes):
    return Net(input_shape, num_classes)


def not_a_module(input_shape, num_classes):
    return "a model"


def wrong_logits(input_shape, num_classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(input_shape)), num_classes + 1))


def broken(input_shape, num_classes):
    return nn.Linear(3, num_classes)  # does not take the samples' shape


def wrong_width(input_shape, num_classes):
    """A model that ignores the data's shape: 7 inputs, 4 outputs."""
    return torch.nn.Linear(7, 4)
