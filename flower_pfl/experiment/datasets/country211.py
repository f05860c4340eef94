"""Country211 (Radford et al. 2021): photographs by country, through torchvision's files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from flower_pfl.experiment.data.images import torchvision_resized_pool
from flower_pfl.experiment.data.info import DataInfo
from flower_pfl.experiment.datasets.base import DataSet, Pool

#: the side the images are resized to (FL-bench's 32 x 32)
SIDE = 32
PARTS = ("train", "valid", "test")


@dataclass
class Country211(DataSet):
    """Country211 (Radford et al. 2021): 63,300 colour YFCC100M photographs of 211 countries (150 train, 50 valid
    and 100 test images each), resized to 32x32 as FL-bench does; the three parts pooled."""

    name = "country211"
    kind = "image"
    downloadable = True
    files_text = "torchvision's `country211/{train,valid,test}/<country>/*.jpg` (OpenAI's country211.tgz unpacked)"

    def info(self) -> DataInfo:
        return DataInfo((3, SIDE, SIDE), 211, self.kind)

    def expected_files(self) -> list[str]:
        return [f"country211/{part}/<country>/*.jpg" for part in PARTS]

    def load_files(self, root: Path, download: bool) -> Pool:
        return Pool(*torchvision_resized_pool("Country211", root, download, self.name, PARTS, SIDE))
