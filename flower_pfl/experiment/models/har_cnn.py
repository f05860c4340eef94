"""PFLlib's HAR-CNN: one-dimensional convolutions over sensor windows."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from flower_pfl.experiment.data.info import DataInfo
from flower_pfl.experiment.models.base import ModelFamily, ModelSettings, scaled, shape_error

#: the kernel along time; the convolutions' channels; the linear layers' units
KERNEL, CHANNELS, UNITS = 9, (32, 64), (1024, 512)


class HARCNN(nn.Module):
    """Two convolutions along time (kernel 9; 32 and 64 channels), each with ReLU and max pooling of 2, then
    ReLU layers of 1024 and 512 units and the head ``fc3`` (PFLlib's ``HARCNN``, its ``(1, 9)`` kernels
    over a ``(channels, 1, time)`` window written as one-dimensional ones)."""

    head_name = "fc3"

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, width: float = 1.0) -> None:
        super().__init__()
        channels, steps = input_shape
        c1, c2 = (scaled(c, width) for c in CHANNELS)
        u1, u2 = (scaled(u, width) for u in UNITS)
        self.conv1 = nn.Conv1d(channels, c1, KERNEL)
        self.conv2 = nn.Conv1d(c1, c2, KERNEL)
        self.fc1 = nn.Linear(c2 * (((steps - KERNEL + 1) // 2 - KERNEL + 1) // 2), u1)
        self.fc2 = nn.Linear(u1, u2)
        self.fc3 = nn.Linear(u2, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool1d(F.relu(self.conv1(x)), 2)
        x = F.max_pool1d(F.relu(self.conv2(x)), 2).flatten(1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


@dataclass
class HARCNNs(ModelFamily):
    """PFLlib's HAR-CNN: convolutions along time over sensor windows (channels, time), then three linear layers."""

    models = {"har-cnn": "two convolutions along time (kernel 9; 32 and 64 channels), 1024- and 512-unit layers, the "
                         "head (PFLlib's HARCNN)"}
    takes = ("signals",)

    def build(self, name: str, data: DataInfo, settings: ModelSettings) -> nn.Module:
        if len(data.input_shape) != 2 or data.input_shape[1] < 4 * KERNEL:
            raise shape_error(name, data, f"signal windows (channels, time) of at least {4 * KERNEL} steps")
        return HARCNN(data.input_shape, data.num_classes, settings.width)
