"""Tiny-ImageNet (Le and Yang 2015), from its archive's layout or the hub."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flower_pfl.experiment.data.hub import Hub
from flower_pfl.experiment.data.images import read_images
from flower_pfl.experiment.data.info import DataInfo
from flower_pfl.experiment.datasets.base import DataSet, Pool

FOLDER = "tiny-imagenet-200"


@dataclass
class TinyImageNet(DataSet):
    """Tiny-ImageNet (Le and Yang 2015): 110,000 colour 64x64 images of 200 ImageNet classes (its training and
    validation parts pooled, as FL-bench; the test part has no labels)."""

    name = "tiny-imagenet"
    kind = "image"
    hub = Hub("zh-plus/tiny-imagenet", x="image", y="label", splits=("train", "valid"))
    files_text = f"the archive's `{FOLDER}/`: `wnids.txt`, `train/<wnid>/images/*.JPEG`, `val/images/*.JPEG` and `val/val_annotations.txt`"

    def info(self) -> DataInfo:
        return DataInfo((3, 64, 64), 200, self.kind)

    def expected_files(self) -> list[str]:
        return [f"{FOLDER}/wnids.txt", f"{FOLDER}/train/<wnid>/images/*.JPEG", f"{FOLDER}/val/val_annotations.txt",
                f"{FOLDER}/val/images/*.JPEG"]

    def load_files(self, root: Path, download: bool) -> Pool:
        """The training images by folder (classes in the order of ``wnids.txt``), then the validation images
        labelled by ``val_annotations.txt``."""
        folder = Path(root) / FOLDER
        if not (folder / "wnids.txt").is_file():
            raise FileNotFoundError(f"no {FOLDER}/wnids.txt under {Path(root).resolve()}")
        wnids = (folder / "wnids.txt").read_text().split()
        label = {wnid: i for i, wnid in enumerate(wnids)}
        paths, labels = [], []
        for wnid in wnids:
            files = sorted((folder / "train" / wnid / "images").glob("*.JPEG"))
            paths += [str(f) for f in files]
            labels += [label[wnid]] * len(files)
        for line in (folder / "val" / "val_annotations.txt").read_text().splitlines():
            file, wnid = line.split("\t")[:2]
            paths.append(str(folder / "val" / "images" / file))
            labels.append(label[wnid])
        return Pool(read_images(paths), np.asarray(labels))
