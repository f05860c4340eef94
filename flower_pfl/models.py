"""Models used by the papers' experiments."""

from __future__ import annotations

import torch
from torch import nn

MODELS: tuple[str, ...] = ("mlr", "dnn")


class MLR(nn.Module):
    """Multinomial logistic regression: one linear layer, softmax in the loss."""

    def __init__(self, in_features: int, num_classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(in_features, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))


class DNN(nn.Module):
    """Two-layer network with one ReLU hidden layer (FedMCSA / pFedMe's DNN)."""

    def __init__(self, in_features: int, num_classes: int, hidden: int = 20) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


def build_model(name: str, in_features: int, num_classes: int, hidden: int = 20, seed: int | None = None) -> nn.Module:
    """Build a model by name; ``seed`` fixes its initialization."""
    if seed is not None:
        torch.manual_seed(seed)
    if name == "mlr":
        return MLR(in_features, num_classes)
    if name == "dnn":
        return DNN(in_features, num_classes, hidden)
    raise ValueError(f"model must be one of {MODELS}, got {name!r}")
