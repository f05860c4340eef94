"""McMahan et al.'s CNNs: PFLlib's and FL-bench's "4-layer CNN" (two convolutions, two linear layers)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from flower_pfl.experiment.data.info import DataInfo
from flower_pfl.experiment.models.base import ModelFamily, ModelSettings, scaled, shape_error
from flower_pfl.experiment.models.linear import norm_or_identity


class ConvNet(nn.Module):
    """Two 5x5 conv layers, each with ReLU and 2x2 max pooling, then ReLU fully connected layers.

    ``"cnn"``: 32 and 64 channels, one 512-unit layer: McMahan et al.'s CNN for (F)MNIST /
    EMNIST (1 x 28 x 28), PFLlib's ``FedAvgCNN`` and FL-bench's ``avgcnn`` on any image size.
    ``"cifar-cnn"``: 64 and 64 channels, 384- and 192-unit layers: McMahan et al.'s CIFAR-10 CNN
    (3 x 32 x 32). ``batch_norm=True`` (``"cnn-bn"``, for FedBN) puts a BatchNorm2d after each conv
    layer, before its ReLU.
    """

    def __init__(self, input_shape: tuple[int, ...], num_classes: int,
                 channels: tuple[int, int] = (32, 64), hidden: tuple[int, ...] = (512,), batch_norm: bool = False) -> None:
        super().__init__()
        in_channels, height, width = input_shape
        self.conv1 = nn.Conv2d(in_channels, channels[0], 5)
        self.bn1 = norm_or_identity(nn.BatchNorm2d, channels[0], batch_norm)
        self.conv2 = nn.Conv2d(channels[0], channels[1], 5)
        self.bn2 = norm_or_identity(nn.BatchNorm2d, channels[1], batch_norm)
        side = lambda n: ((n - 4) // 2 - 4) // 2
        sizes = [channels[1] * side(height) * side(width), *hidden, num_classes]
        self.fc = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))
        self.head_name = f"fc.{len(self.fc) - 1}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2).flatten(1)
        for layer in self.fc[:-1]:
            x = F.relu(layer(x))
        return self.fc[-1](x)


CONV_NETS: dict[str, dict[str, tuple[int, ...]]] = {"cnn": {"channels": (32, 64), "hidden": (512,)},
                                                    "cifar-cnn": {"channels": (64, 64), "hidden": (384, 192)}}


@dataclass
class ConvNets(ModelFamily):
    """McMahan et al.'s CNNs (2017): two 5x5 convolutions with max pooling, then ReLU linear layers."""

    models = {
        "cnn": "32 and 64 channels, a 512-unit layer: McMahan et al.'s (F)MNIST CNN, PFLlib's and FL-bench's "
               "\"4-layer CNN\" on any image size",
        "cifar-cnn": "64 and 64 channels, 384- and 192-unit layers: McMahan et al.'s CIFAR-10 CNN",
        "cnn-bn": "the CNN with batch normalization after each convolution (FedBN)",
    }
    takes = ("image",)

    def build(self, name: str, data: DataInfo, settings: ModelSettings) -> nn.Module:
        if len(data.input_shape) != 3 or min(data.input_shape[1:]) < 16:
            raise shape_error(name, data, "images (channels, height, width) of at least 16x16")
        spec = CONV_NETS[name.removesuffix("-bn")]
        channels = tuple(scaled(c, settings.width) for c in spec["channels"])
        return ConvNet(data.input_shape, data.num_classes, channels=channels,  # type: ignore[arg-type]
                       hidden=tuple(scaled(h, settings.width) for h in spec["hidden"]), batch_norm=name.endswith("-bn"))
