"""Country211 (Radford et al. 2021): photographs by country, through torchvision's files."""

from __future__ import annotations

from dataclasses import dataclass

from flower_pfl.experiment.datasets.base import ResizedTorchvisionImages


@dataclass
class Country211(ResizedTorchvisionImages):
    """Country211 (Radford et al. 2021): 63,300 colour YFCC100M photographs of 211 countries (150 train, 50 valid
    and 100 test images each), resized to 32x32 as FL-bench does; the three parts pooled."""

    name = "country211"
    files_text = "torchvision's `country211/{train,valid,test}/<country>/*.jpg` (OpenAI's country211.tgz unpacked)"
    torchvision_class, parts, classes = "Country211", ("train", "valid", "test"), 211
    files = tuple(f"country211/{part}/<country>/*.jpg" for part in ("train", "valid", "test"))
