"""CINIC-10 (Darlow et al. 2018), from its archive's layout or the hub."""

from __future__ import annotations

from dataclasses import dataclass

from flower_pfl.experiment.data.hub import Hub
from flower_pfl.experiment.datasets.base import ClassFolders


@dataclass
class CINIC10(ClassFolders):
    """CINIC-10 (Darlow et al. 2018): 270,000 colour 32x32 images of CIFAR-10's classes, from CIFAR-10 and
    ImageNet (its train, valid and test parts pooled, as FL-bench)."""

    name = "cinic10"
    hub = Hub("flwrlabs/cinic10", x="image", y="label", splits=("train", "validation", "test"))
    folder, parts, side, suffixes = "CINIC-10", ("train", "valid", "test"), 32, (".png",)
    #: the archive's class folders, in CIFAR-10's label order
    class_names = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
    files_text = f"the archive's `{folder}/{{train,valid,test}}/<class>/*.png`"
