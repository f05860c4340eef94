"""Omniglot (Lake et al. 2015), from the folders of its two archives."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flower_pfl.engine.extras import require
from flower_pfl.engine.params import one_of, param
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
    character its own class (or each alphabet: PFLlib's 50 labels), numbered in sorted order across both sets;
    naturally one drawer per client (the number ending a drawing's file name, 01-20)."""

    name = "omniglot"
    kind = "image"
    natural = "drawer"
    downloadable = True
    files_text = (f"torchvision's `{FOLDER}/{PARTS[0]}/<alphabet>/<character>/*.png` and `{FOLDER}/{PARTS[1]}/...` "
                  "(images_background.zip and images_evaluation.zip unpacked)")

    labels: str = param("character", key="omniglot-labels", must=one_of("character", "alphabet"),
                        doc="what a label is: the character (1,623 classes) or its alphabet (50, PFLlib's real-world setting)")

    def info(self) -> DataInfo:
        return DataInfo((1, SIDE, SIDE), 1623 if self.labels == "character" else 50, self.kind)

    def expected_files(self) -> list[str]:
        return [f"{FOLDER}/{part}/<alphabet>/<character>/*.png" for part in PARTS]

    def load_files(self, root: Path, download: bool) -> Pool:
        """The folders in sorted order (torchvision's ``Omniglot`` numbers the characters in the order the file system
        lists them, which differs between machines: a deployment's nodes would disagree on the labels; PFLlib's
        clients take a character's drawings in that order too, where here a client is one drawer)."""
        if download:
            require("torchvision", why="dataset = 'omniglot' with download = true")
            from torchvision.datasets import Omniglot as Download

            for background in (True, False):
                Download(str(root), background=background, download=True)
        require_files(root, self.expected_files())
        characters = [c for part in PARTS for c in sorted((Path(root) / FOLDER / part).glob("*/*")) if c.is_dir()]
        alphabets = sorted({c.parent.name for c in characters})
        paths: list[Path] = []
        labels: list[int] = []
        for number, character in enumerate(characters):
            drawings = sorted(character.glob("*.png"))
            paths += drawings
            labels += [number if self.labels == "character" else alphabets.index(character.parent.name)] * len(drawings)
        drawers = np.asarray([f"drawer{p.stem.rsplit('_', 1)[-1]}" for p in paths], dtype=object)
        return Pool(read_images(paths, SIDE, grey=True), np.asarray(labels), groups=drawers)
