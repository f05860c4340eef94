"""SVHN (Netzer et al. 2011), through torchvision's files or the hub."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from flower_pfl.engine.extras import require
from flower_pfl.experiment.data.hub import Hub
from flower_pfl.experiment.datasets.base import Pool, TorchvisionImages


@dataclass
class SVHN(TorchvisionImages):
    """SVHN (Netzer et al. 2011): 99,289 colour 32x32 house-number digits, 10 classes (its train and test parts
    pooled; the extra part is left out)."""

    name = "svhn"
    hub = Hub("ufldl-stanford/svhn", x="image", y="label", config="cropped_digits")
    files_text = "torchvision's `train_32x32.mat` and `test_32x32.mat`"
    torchvision_class, files, shape = "SVHN", ("train_32x32.mat", "test_32x32.mat"), (3, 32, 32)

    def load_files(self, root: Path, download: bool) -> Pool:
        require("scipy", why="SVHN's .mat files")
        return super().load_files(root, download)
