"""Oxford Flowers-102 (Nilsback and Zisserman 2008), through torchvision's files."""

from __future__ import annotations

from dataclasses import dataclass

from flower_pfl.experiment.datasets.base import ResizedTorchvisionImages


@dataclass
class Flowers102(ResizedTorchvisionImages):
    """Oxford Flowers-102 (Nilsback and Zisserman 2008): 8,189 colour photographs of 102 flower species, resized to
    32x32 as FL-bench does; the train, val and test parts of its setid.mat pooled."""

    name = "flowers102"
    files_text = ("torchvision's `flowers-102/jpg/image_<n>.jpg`, `flowers-102/imagelabels.mat` and "
                  "`flowers-102/setid.mat` (102flowers.tgz unpacked beside the two .mat files)")
    needs = "scipy"  # its .mat files
    torchvision_class, parts, classes = "Flowers102", ("train", "val", "test"), 102
    files = ("flowers-102/jpg/image_<n>.jpg", "flowers-102/imagelabels.mat", "flowers-102/setid.mat")
