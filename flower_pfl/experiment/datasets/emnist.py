"""EMNIST (Cohen et al. 2017), through torchvision's files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from flower_pfl.engine.params import one_of, param
from flower_pfl.experiment.data.images import torchvision_pool
from flower_pfl.experiment.data.info import DataInfo
from flower_pfl.experiment.datasets.base import Pool, TorchvisionImages

#: classes of each split
SPLITS: dict[str, int] = {"byclass": 62, "bymerge": 47, "balanced": 47, "letters": 27, "digits": 10, "mnist": 10}


@dataclass
class EMNIST(TorchvisionImages):
    """EMNIST (Cohen et al. 2017): grey 28x28 handwritten characters of one of its splits (train and test pooled)."""

    name = "emnist"
    torchvision_class, shape = "EMNIST", (1, 28, 28)
    files_text = "torchvision's `EMNIST/raw/emnist-<split>-*-ubyte`"

    split: str = param("byclass", key="emnist-split", must=one_of(*SPLITS),
                       doc="EMNIST's split: byclass (62 classes), bymerge, balanced (47), letters (27), digits, mnist (10)")

    def info(self) -> DataInfo:
        return DataInfo(self.shape, SPLITS[self.split], self.kind)

    def expected_files(self) -> list[str]:
        return [f"EMNIST/raw/emnist-{self.split}-{part}-{kind}-ubyte" for part in ("train", "test")
                for kind in ("images-idx3", "labels-idx1")]

    def load_files(self, root: Path, download: bool) -> Pool:
        self.require(root, download)
        x, y = torchvision_pool("EMNIST", root, download, self.name, split=self.split)
        return Pool(x.transpose(0, 1, 3, 2).copy(), y)  # EMNIST's files store every image transposed
