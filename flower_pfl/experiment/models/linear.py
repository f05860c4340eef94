"""Multinomial logistic regression and the one-hidden-layer network of FedMCSA and pFedMe."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from flower_pfl.engine.params import AT_LEAST_ONE, param
from flower_pfl.experiment.data.info import DataInfo
from flower_pfl.experiment.models.base import ModelFamily, ModelSettings


class MLR(nn.Module):
    """Multinomial logistic regression: one linear layer, softmax in the loss."""

    head_name = "fc"

    def __init__(self, in_features: int, num_classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(in_features, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))


def norm_or_identity(kind: type[nn.modules.batchnorm._BatchNorm], features: int, wanted: bool) -> nn.Module:
    """A batch-norm layer where ``wanted``, else the identity (no tensors: the ``state_dict`` is unchanged)."""
    return kind(features) if wanted else nn.Identity()


class DNN(nn.Module):
    """Two-layer network with one ReLU hidden layer (FedMCSA / pFedMe's DNN); ``batch_norm=True``
    (``"dnn-bn"``, for FedBN) puts a BatchNorm1d between the hidden layer and its ReLU."""

    head_name = "fc2"

    def __init__(self, in_features: int, num_classes: int, hidden: int = 20, batch_norm: bool = False) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.bn1 = norm_or_identity(nn.BatchNorm1d, hidden, batch_norm)
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.bn1(self.fc1(x.flatten(1)))))


@dataclass
class LinearModels(ModelFamily):
    """Multinomial logistic regression and the DNN of FedMCSA and pFedMe, on any sample flattened."""

    models = {
        "mlr": "multinomial logistic regression: one linear layer",
        "dnn": "one ReLU hidden layer of `hidden-units` (FedMCSA's and pFedMe's DNN)",
        "dnn-bn": "the DNN with batch normalization before its ReLU (FedBN)",
    }
    takes = ("features", "image", "signals")

    hidden: int = param(20, key="hidden-units", must=AT_LEAST_ONE, doc="the DNN's hidden layer")

    def build(self, name: str, data: DataInfo, settings: ModelSettings) -> nn.Module:
        features = int(np.prod(data.input_shape))
        if name == "mlr":
            return MLR(features, data.num_classes)
        return DNN(features, data.num_classes, self.hidden, batch_norm=name == "dnn-bn")
