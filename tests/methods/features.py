"""The small problem the representation methods' tests work by hand (FedProto, FedDBE, FedPAC, FedGen):
standard-normal inputs in three classes set by the signs of two features, and a seeded DNN."""

from __future__ import annotations

import torch

from flower_pfl.experiment.models import DNN


def three_classes(n: int, features: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` inputs of ``features`` N(0, 1) values (seed 0); class ``[x_0 > 0] + [x_1 > 0.5]``."""
    x = torch.randn(n, features, generator=torch.Generator().manual_seed(0))
    return x, (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()


def seeded_dnn(features: int, classes: int, hidden: int, seed: int = 0) -> DNN:
    """``DNN(features, classes, hidden=hidden)`` initialised under ``torch.manual_seed(seed)``."""
    torch.manual_seed(seed)
    return DNN(features, classes, hidden=hidden)
