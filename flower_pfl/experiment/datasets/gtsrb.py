"""GTSRB (Stallkamp et al. 2012): German traffic signs, through torchvision's files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from flower_pfl.experiment.data.images import torchvision_resized_pool
from flower_pfl.experiment.data.info import DataInfo
from flower_pfl.experiment.datasets.base import DataSet, Pool

#: the side the images are resized to (FL-bench's 32 x 32)
SIDE = 32
CLASSES = 43


@dataclass
class GTSRB(DataSet):
    """GTSRB (Stallkamp et al. 2012): 51,839 colour photographs of 43 kinds of German traffic sign, 15x15 to
    250x250 pixels, resized to 32x32 as FL-bench does; the training and test parts pooled."""

    name = "gtsrb"
    kind = "image"
    downloadable = True
    files_text = ("torchvision's `gtsrb/GTSRB/Training/<class>/*.ppm`, `gtsrb/GTSRB/Final_Test/Images/*.ppm` and "
                  "`gtsrb/GT-final_test.csv` (the archives GTSRB_Final_Training_Images.zip, GTSRB_Final_Test_Images.zip and "
                  "GTSRB_Final_Test_GT.zip unpacked)")

    def info(self) -> DataInfo:
        return DataInfo((3, SIDE, SIDE), CLASSES, self.kind)

    def expected_files(self) -> list[str]:
        return ["gtsrb/GTSRB/Training/<class>/*.ppm", "gtsrb/GTSRB/Final_Test/Images/*.ppm", "gtsrb/GT-final_test.csv"]

    def load_files(self, root: Path, download: bool) -> Pool:
        return Pool(*torchvision_resized_pool("GTSRB", root, download, self.name, ("train", "test"), SIDE))
