"""MedMNIST v2 (Yang et al. 2023): FL-bench's organ sets, from MedMNIST's own ``.npz`` files."""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flower_pfl.engine.params import one_of, param
from flower_pfl.experiment.data.files import MalformedFile, require_files
from flower_pfl.experiment.data.images import channels_first
from flower_pfl.experiment.data.info import DataInfo
from flower_pfl.experiment.datasets.base import DataSet, Pool

#: FL-bench's MedMNIST sets: abdominal CT slices of 11 organs, axial (A), coronal (C) and sagittal (S)
SUBSETS = {"organamnist": 11, "organcmnist": 11, "organsmnist": 11}
#: the parts of a MedMNIST file, pooled
PARTS = ("train", "val", "test")


@dataclass
class MedMNIST(DataSet):
    """MedMNIST v2 (Yang et al. 2023): grey 28x28 abdominal CT slices of 11 organs, one of FL-bench's organ sets
    (OrganAMNIST, OrganCMNIST, OrganSMNIST: 58,850, 23,660 and 25,221 images), its train, val and test parts pooled."""

    name = "medmnist"
    kind = "image"
    files_text = "MedMNIST's `<subset>.npz` (as the `medmnist` package downloads it: train, val and test images and labels)"

    subset: str = param("organamnist", key="medmnist-subset", must=one_of(*SUBSETS),
                        doc="the organ set: organamnist (axial), organcmnist (coronal), organsmnist (sagittal); 11 classes each")

    def info(self) -> DataInfo:
        return DataInfo((1, 28, 28), SUBSETS[self.subset], self.kind)

    def expected_files(self) -> list[str]:
        return [f"{self.subset}.npz"]

    def load_files(self, root: Path, download: bool) -> Pool:
        require_files(root, self.expected_files())
        path = Path(root) / f"{self.subset}.npz"
        try:
            with np.load(path) as npz:
                parts = [(npz[f"{part}_images"], npz[f"{part}_labels"]) for part in PARTS]
        except (KeyError, ValueError, OSError, zipfile.BadZipFile) as err:
            raise MalformedFile(f"{path}: not MedMNIST's .npz ({{train,val,test}}_{{images,labels}}): {err}") from err
        if any(images.shape[1:] != (28, 28) or len(images) != len(labels) for images, labels in parts):
            raise MalformedFile(f"{path}: expected 28x28 grey images with one label each (MedMNIST's 28-pixel release), "
                                f"got {[images.shape for images, _ in parts]}")
        return Pool(np.concatenate([channels_first(images) for images, _ in parts]),
                    np.concatenate([np.asarray(labels).reshape(-1) for _, labels in parts]))
