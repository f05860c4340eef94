"""Omniglot (Lake et al. 2015), from the folders of its two archives."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flower_pfl.engine.extras import require
from flower_pfl.experiment.data.files import require_files
from flower_pfl.experiment.data.images import read_images
from flower_pfl.experiment.data.info import DataInfo
from flower_pfl.experiment.datasets.base import DataSet, Pool

FOLDER = "omniglot-py"
#: the archives' folders: the background set (964 characters of 30 alphabets), then the evaluation set (659 of 20)
PARTS = ("images_background", "images_evaluation")
SIDE = 28


@dataclass
class Omniglot(DataSet):
    """Omniglot (Lake et al. 2015): 32,460 grey 105x105 drawings of 1,623 characters of 50 alphabets, 20 drawers
    each, resized to 28x28 as the few-shot literature does; the background and evaluation sets pooled, each
    character its own class, numbered in sorted order (alphabet, then character) across both sets."""

    name = "omniglot"
    kind = "image"
    downloadable = True
    files_text = (f"torchvision's `{FOLDER}/{PARTS[0]}/<alphabet>/<character>/*.png` and `{FOLDER}/{PARTS[1]}/...` "
                  "(images_background.zip and images_evaluation.zip unpacked)")

    def info(self) -> DataInfo:
        return DataInfo((1, SIDE, SIDE), 1623, self.kind)

    def expected_files(self) -> list[str]:
        return [f"{FOLDER}/{part}/<alphabet>/<character>/*.png" for part in PARTS]

    def load_files(self, root: Path, download: bool) -> Pool:
        """The characters' folders in sorted order (torchvision's ``Omniglot`` numbers them in the order the file
        system lists them, which differs between machines: a deployment's nodes would disagree on the labels)."""
        if download:
            require("torchvision", why="dataset = 'omniglot' with download = true")
            from torchvision.datasets import Omniglot as Download

            for background in (True, False):
                Download(str(root), background=background, download=True)
        require_files(root, self.expected_files())
        paths: list[Path] = []
        labels: list[int] = []
        characters = [c for part in PARTS for c in sorted((Path(root) / FOLDER / part).glob("*/*")) if c.is_dir()]
        for label, character in enumerate(characters):
            drawings = sorted(character.glob("*.png"))
            paths += drawings
            labels += [label] * len(drawings)
        return Pool(read_images(paths, SIDE, grey=True), np.asarray(labels))
