"""USPS (Hull 1994), through torchvision's files or the hub."""

from __future__ import annotations

from dataclasses import dataclass

from flower_pfl.experiment.data.hub import Hub
from flower_pfl.experiment.datasets.base import TorchvisionImages


@dataclass
class USPS(TorchvisionImages):
    """USPS (Hull 1994): 9,298 grey 16x16 handwritten digits, 10 classes (train and test pooled)."""

    name = "usps"
    hub = Hub("flwrlabs/usps", x="image", y="label")
    files_text = "torchvision's `usps.bz2` and `usps.t.bz2`"
    torchvision_class, files, shape = "USPS", ("usps.bz2", "usps.t.bz2"), (1, 16, 16)
