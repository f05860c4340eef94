"""GTSRB (Stallkamp et al. 2012): German traffic signs, through torchvision's files."""

from __future__ import annotations

from dataclasses import dataclass

from flower_pfl.experiment.datasets.base import ResizedTorchvisionImages


@dataclass
class GTSRB(ResizedTorchvisionImages):
    """GTSRB (Stallkamp et al. 2012): 51,839 colour photographs of 43 kinds of German traffic sign, 15x15 to
    250x250 pixels, resized to 32x32 as FL-bench does; the training and test parts pooled."""

    name = "gtsrb"
    files_text = ("torchvision's `gtsrb/GTSRB/Training/<class>/*.ppm`, `gtsrb/GTSRB/Final_Test/Images/*.ppm` and "
                  "`gtsrb/GT-final_test.csv` (the archives GTSRB_Final_Training_Images.zip, GTSRB_Final_Test_Images.zip and "
                  "GTSRB_Final_Test_GT.zip unpacked)")
    torchvision_class, parts, classes = "GTSRB", ("train", "test"), 43
    files = ("gtsrb/GTSRB/Training/<class>/*.ppm", "gtsrb/GTSRB/Final_Test/Images/*.ppm", "gtsrb/GT-final_test.csv")
