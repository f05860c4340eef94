"""Fashion-MNIST (Xiao et al. 2017), through torchvision's files or the hub."""

from __future__ import annotations

from dataclasses import dataclass

from flower_pfl.experiment.data.hub import Hub
from flower_pfl.experiment.datasets.base import TorchvisionImages
from flower_pfl.experiment.datasets.mnist import idx_files


@dataclass
class FashionMNIST(TorchvisionImages):
    """Fashion-MNIST (Xiao et al. 2017): 70,000 grey 28x28 clothing images, 10 classes (train and test pooled)."""

    name = "fmnist"
    hub = Hub("zalando-datasets/fashion_mnist", x="image", y="label")
    files_text = "torchvision's `FashionMNIST/raw/*-ubyte`"
    torchvision_class, files, shape = "FashionMNIST", idx_files("FashionMNIST"), (1, 28, 28)
