"""The model: a small one-dimensional CNN.

flower-pfl calls ``build(input_shape, num_classes)`` with one sample's shape (here ``(1, 64)``). The
attribute ``head_name`` names the head, the ``nn.Linear`` whose input is the representation: the methods
that split a model into a body and a head (FedPer, FedRep, FedRoD, ...) or read its representation
(FedProto, MOON, ...) use it; without it they take the last ``nn.Linear``. Register the head last.
"""

from __future__ import annotations

import torch
from torch import nn


class VibrationNet(nn.Module):
    head_name = "head"

    def __init__(self, channels: int, num_classes: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(channels, 8, 7, padding=3)
        self.conv2 = nn.Conv1d(8, 16, 5, padding=2)
        self.hidden = nn.Linear(16, 32)
        self.head = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.max_pool1d(torch.relu(self.conv1(x)), 2)
        x = torch.relu(self.conv2(x)).mean(2)  # the mean over time
        return self.head(torch.relu(self.hidden(x)))


def build(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    return VibrationNet(input_shape[0], num_classes)
