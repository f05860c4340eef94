"""MNIST (LeCun et al. 1998), through torchvision's files or the hub."""

from __future__ import annotations

from dataclasses import dataclass

from flower_pfl.experiment.data.hub import Hub
from flower_pfl.experiment.datasets.base import TorchvisionImages


def idx_files(folder: str, prefixes: tuple[str, str] = ("train", "t10k")) -> tuple[str, ...]:
    """The idx files of an MNIST-like data set in torchvision's layout."""
    return tuple(f"{folder}/raw/{p}-{kind}-ubyte" for p in prefixes for kind in ("images-idx3", "labels-idx1"))


@dataclass
class MNIST(TorchvisionImages):
    """MNIST (LeCun et al. 1998): 70,000 grey 28x28 handwritten digits, 10 classes (train and test pooled)."""

    name = "mnist"
    hub = Hub("ylecun/mnist", x="image", y="label")
    files_text = "torchvision's `MNIST/raw/*-ubyte`"
    torchvision_class, files, shape = "MNIST", idx_files("MNIST"), (1, 28, 28)
