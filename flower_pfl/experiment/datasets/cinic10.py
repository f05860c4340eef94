"""CINIC-10 (Darlow et al. 2018), from its archive's layout or the hub."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flower_pfl.experiment.data.hub import Hub
from flower_pfl.experiment.data.images import read_images
from flower_pfl.experiment.data.info import DataInfo
from flower_pfl.experiment.datasets.base import DataSet, Pool

FOLDER = "CINIC-10"
PARTS = ("train", "valid", "test")
#: the archive's class folders, in CIFAR-10's label order
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


@dataclass
class CINIC10(DataSet):
    """CINIC-10 (Darlow et al. 2018): 270,000 colour 32x32 images of CIFAR-10's classes, from CIFAR-10 and
    ImageNet (its train, valid and test parts pooled, as FL-bench)."""

    name = "cinic10"
    kind = "image"
    hub = Hub("flwrlabs/cinic10", x="image", y="label", splits=("train", "validation", "test"))
    files_text = f"the archive's `{FOLDER}/{{train,valid,test}}/<class>/*.png`"

    def info(self) -> DataInfo:
        return DataInfo((3, 32, 32), 10, self.kind)

    def expected_files(self) -> list[str]:
        return [f"{FOLDER}/{part}/<class>/*.png" for part in PARTS]

    def load_files(self, root: Path, download: bool) -> Pool:
        folder = Path(root) / FOLDER
        if not all((folder / part).is_dir() for part in PARTS):
            raise FileNotFoundError(f"no {FOLDER}/{{{','.join(PARTS)}}} under {Path(root).resolve()}")
        paths, labels = [], []
        for part in PARTS:
            for label, name in enumerate(CLASSES):
                files = sorted((folder / part / name).glob("*.png"))
                paths += [str(f) for f in files]
                labels += [label] * len(files)
        return Pool(read_images(paths), np.asarray(labels))
