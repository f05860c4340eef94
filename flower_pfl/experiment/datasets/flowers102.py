"""Oxford Flowers-102 (Nilsback and Zisserman 2008), through torchvision's files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from flower_pfl.engine.extras import require
from flower_pfl.experiment.data.images import torchvision_resized_pool
from flower_pfl.experiment.data.info import DataInfo
from flower_pfl.experiment.datasets.base import DataSet, Pool

#: the side the images are resized to (FL-bench's 32 x 32)
SIDE = 32
PARTS = ("train", "val", "test")


@dataclass
class Flowers102(DataSet):
    """Oxford Flowers-102 (Nilsback and Zisserman 2008): 8,189 colour photographs of 102 flower species, resized to
    32x32 as FL-bench does; the train, val and test parts of its setid.mat pooled."""

    name = "flowers102"
    kind = "image"
    downloadable = True
    files_text = ("torchvision's `flowers-102/jpg/image_<n>.jpg`, `flowers-102/imagelabels.mat` and "
                  "`flowers-102/setid.mat` (102flowers.tgz unpacked beside the two .mat files)")

    def info(self) -> DataInfo:
        return DataInfo((3, SIDE, SIDE), 102, self.kind)

    def expected_files(self) -> list[str]:
        return ["flowers-102/jpg/image_<n>.jpg", "flowers-102/imagelabels.mat", "flowers-102/setid.mat"]

    def load_files(self, root: Path, download: bool) -> Pool:
        require("scipy", why="Flowers-102's .mat files")
        return Pool(*torchvision_resized_pool("Flowers102", root, download, self.name, PARTS, SIDE))
