"""Models used by the papers' experiments."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

MODELS: tuple[str, ...] = ("mlr", "dnn", "cnn", "cifar-cnn", "dnn-bn", "cnn-bn")


class MLR(nn.Module):
    """Multinomial logistic regression: one linear layer, softmax in the loss."""

    def __init__(self, in_features: int, num_classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(in_features, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))


def _norm(kind: type[nn.modules.batchnorm._BatchNorm], features: int, wanted: bool) -> nn.Module:
    """A batch-norm layer where ``wanted``, else the identity (no tensors: the ``state_dict`` is unchanged)."""
    return kind(features) if wanted else nn.Identity()


class DNN(nn.Module):
    """Two-layer network with one ReLU hidden layer (FedMCSA / pFedMe's DNN); ``batch_norm=True``
    (``"dnn-bn"``, for FedBN) puts a BatchNorm1d between the hidden layer and its ReLU."""

    def __init__(self, in_features: int, num_classes: int, hidden: int = 20, batch_norm: bool = False) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.bn1 = _norm(nn.BatchNorm1d, hidden, batch_norm)
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.bn1(self.fc1(x.flatten(1)))))


class ConvNet(nn.Module):
    """Two 5x5 conv layers, each with ReLU and 2x2 max pooling, then ReLU fully connected layers.

    ``"cnn"``: 32 and 64 channels, one 512-unit layer: McMahan et al.'s CNN for (F)MNIST /
    EMNIST (1 x 28 x 28). ``"cifar-cnn"``: 64 and 64 channels, 384- and 192-unit layers:
    McMahan et al.'s CIFAR-10 CNN (3 x 32 x 32). ``batch_norm=True`` (``"cnn-bn"``, for FedBN) puts a
    BatchNorm2d after each conv layer, before its ReLU.
    """

    def __init__(self, input_shape: tuple[int, ...], num_classes: int,
                 channels: tuple[int, int] = (32, 64), hidden: tuple[int, ...] = (512,), batch_norm: bool = False) -> None:
        super().__init__()
        in_channels, height, width = input_shape
        self.conv1 = nn.Conv2d(in_channels, channels[0], 5)
        self.bn1 = _norm(nn.BatchNorm2d, channels[0], batch_norm)
        self.conv2 = nn.Conv2d(channels[0], channels[1], 5)
        self.bn2 = _norm(nn.BatchNorm2d, channels[1], batch_norm)
        side = lambda n: ((n - 4) // 2 - 4) // 2
        sizes = [channels[1] * side(height) * side(width), *hidden, num_classes]
        self.fc = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2).flatten(1)
        for layer in self.fc[:-1]:
            x = F.relu(layer(x))
        return self.fc[-1](x)


CONV_NETS: dict[str, dict[str, Any]] = {"cnn": {"channels": (32, 64), "hidden": (512,)}, "cifar-cnn": {"channels": (64, 64), "hidden": (384, 192)}}


def build_model(
    name: str, input_shape: tuple[int, ...], num_classes: int, hidden: int = 20, seed: int | None = None
) -> nn.Module:
    """Build a model by name for inputs of ``input_shape`` (one sample); ``seed`` fixes its initialization.
    ``"dnn-bn"`` and ``"cnn-bn"`` are ``"dnn"`` and ``"cnn"`` with batch normalization (FedBN)."""
    if seed is not None:
        torch.manual_seed(seed)
    features = int(np.prod(input_shape))
    if name == "mlr":
        return MLR(features, num_classes)
    if name in ("dnn", "dnn-bn"):
        return DNN(features, num_classes, hidden, batch_norm=name == "dnn-bn")
    if name.removesuffix("-bn") in CONV_NETS:
        if len(input_shape) != 3:
            raise ValueError(f"model {name!r} needs image input (channels, height, width), got shape {input_shape}")
        return ConvNet(input_shape, num_classes, **CONV_NETS[name.removesuffix("-bn")], batch_norm=name.endswith("-bn"))
    raise ValueError(f"model must be one of {MODELS}, got {name!r}")
