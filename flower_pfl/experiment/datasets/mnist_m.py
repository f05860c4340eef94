"""MNIST-M (Ganin et al. 2016), from the hub's files."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from flower_pfl.experiment.data.hub import Hub
from flower_pfl.experiment.data.images import decode_images, resize
from flower_pfl.experiment.data.info import DataInfo
from flower_pfl.experiment.datasets.base import DataSet, Pool


@dataclass
class MNISTM(DataSet):
    """MNIST-M (Ganin et al. 2016): MNIST's digits blended over colour photographs, 32x32, 10 classes (train and
    test pooled)."""

    name = "mnist-m"
    kind = "image"
    hub = Hub("Mike0307/MNIST-M", x="image", y="label")
    has_files = False
    files_text = "the hub's files (`Mike0307/MNIST-M`)"

    def info(self) -> DataInfo:
        return DataInfo((3, 32, 32), 10, self.kind)

    def from_hub(self, columns: Mapping[str, Sequence[Any]]) -> Pool:
        images = decode_images(columns["image"], (3,))
        return Pool(resize(images, 32, 3), np.asarray(columns["label"]))
