"""CIFAR-10 (Krizhevsky 2009), through torchvision's files or the hub."""

from __future__ import annotations

from dataclasses import dataclass

from flower_pfl.experiment.data.hub import Hub
from flower_pfl.experiment.datasets.base import TorchvisionImages


@dataclass
class CIFAR10(TorchvisionImages):
    """CIFAR-10 (Krizhevsky 2009): 60,000 colour 32x32 images, 10 classes (train and test pooled)."""

    name = "cifar10"
    hub = Hub("uoft-cs/cifar10", x="img", y="label")
    files_text = "torchvision's `cifar-10-batches-py/`"
    torchvision_class, shape = "CIFAR10", (3, 32, 32)
    files = tuple(f"cifar-10-batches-py/{b}" for b in (*(f"data_batch_{i}" for i in range(1, 6)), "test_batch", "batches.meta"))
