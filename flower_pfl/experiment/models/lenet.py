"""LeNet-5 (LeCun et al. 1998), as federated-learning papers use it on small images."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from flower_pfl.experiment.data.info import DataInfo
from flower_pfl.experiment.models.base import ModelFamily, ModelSettings, scaled, shape_error


class LeNet5(nn.Module):
    """Two 5x5 convolutions (6 and 16 channels), each with ReLU and 2x2 max pooling, then linear layers of
    120 and 84 units with ReLU and the 84-to-classes head; ``width`` scales the channels and units."""

    head_name = "fc3"

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, width: float = 1.0) -> None:
        super().__init__()
        in_channels, height, wide = input_shape
        c1, c2, h1, h2 = (scaled(n, width) for n in (6, 16, 120, 84))
        self.conv1 = nn.Conv2d(in_channels, c1, 5)
        self.conv2 = nn.Conv2d(c1, c2, 5)
        side = lambda n: ((n - 4) // 2 - 4) // 2
        self.fc1 = nn.Linear(c2 * side(height) * side(wide), h1)
        self.fc2 = nn.Linear(h1, h2)
        self.fc3 = nn.Linear(h2, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2).flatten(1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


@dataclass
class LeNets(ModelFamily):
    """LeNet-5 (LeCun et al. 1998) with ReLU and max pooling, on images of any size from 16x16."""

    models = {"lenet5": "LeNet-5: 6 and 16 channels of 5x5 convolutions, 120- and 84-unit layers (without "
                        "FL-bench's batch normalization)"}
    takes = ("image",)

    def build(self, name: str, data: DataInfo, settings: ModelSettings) -> nn.Module:
        if len(data.input_shape) != 3 or min(data.input_shape[1:]) < 16:
            raise shape_error(name, data, "images (channels, height, width) of at least 16x16")
        return LeNet5(data.input_shape, data.num_classes, settings.width)
