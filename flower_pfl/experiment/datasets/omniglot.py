"""Omniglot (Lake et al. 2015), from the folders of its archives."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flower_pfl.engine.extras import require
from flower_pfl.engine.params import Rule, comma_list, one_of, param, some_of
from flower_pfl.experiment.data.files import require_files
from flower_pfl.experiment.data.images import read_images
from flower_pfl.experiment.data.info import DataInfo
from flower_pfl.experiment.datasets.base import DataSet, Pool

FOLDER = "omniglot-py"
#: the publisher's folders (each its archive's name), in the order they are read, with their characters and alphabets:
#: the background set, the evaluation set (the two torchvision downloads), and the two small background sets
SETS = {"images_background": (964, 30), "images_evaluation": (659, 20),
        "images_background_small1": (136, 5), "images_background_small2": (156, 5)}
#: the background sets: images_background holds the small sets' alphabets, which may share some
BACKGROUND = ("images_background", "images_background_small1", "images_background_small2")
DOWNLOADS = ("images_background", "images_evaluation")
SIDE = 28
_SOME = some_of(SETS, "folders")
SETS_RULE = Rule(lambda v: _SOME(v) and len(set(comma_list(v)) & set(BACKGROUND)) <= 1,
                 f"{_SOME.text}, one background set at most (images_background holds the small sets' alphabets)")


@dataclass
class Omniglot(DataSet):
    """Omniglot (Lake et al. 2015): 32,460 grey 105x105 drawings of 1,623 characters of 50 alphabets, 20 drawers
    each, resized to 28x28 as the few-shot literature does; the background and evaluation sets pooled (or the sets
    ``omniglot-sets`` names), each character its own class (or each alphabet: PFLlib's 50 labels), numbered in sorted
    order across the sets; naturally one drawer per client (the number ending a drawing's file name, 01-20)."""

    name = "omniglot"
    kind = "image"
    natural = "drawer"
    downloadable = True
    files_text = (f"the publisher's folders unpacked into `{FOLDER}/` as torchvision's download leaves them: "
                  f"`{FOLDER}/images_background/<alphabet>/<character>/*.png` and `{FOLDER}/images_evaluation/...`, both "
                  "(images_background.zip, images_evaluation.zip); with `omniglot-sets` the small sets "
                  f"`{FOLDER}/images_background_small1/...` and `..._small2/...` instead of images_background "
                  "(images_background_small1.zip, images_background_small2.zip of the publisher's repository, brendenlake/omniglot's "
                  "python/; no download)")

    labels: str = param("character", key="omniglot-labels", must=one_of("character", "alphabet"),
                        doc="what a label is: the character (1,623 classes) or its alphabet (50, PFLlib's real-world setting)")
    sets: str = param(",".join(DOWNLOADS), key="omniglot-sets", must=SETS_RULE,
                      doc="the publisher's folders read, comma-separated: both downloads (1,623 characters, 50 alphabets), "
                          "or a small background set (images_background_small1: 136 characters of 5 alphabets; _small2: "
                          "156 of 5) alone or with images_evaluation")

    def chosen(self) -> list[str]:
        """The folders read, in the publisher's order (whatever order ``omniglot-sets`` lists them in)."""
        return [part for part in SETS if part in comma_list(self.sets)]

    def info(self) -> DataInfo:
        characters, alphabets = (sum(SETS[part][i] for part in self.chosen()) for i in (0, 1))
        return DataInfo((1, SIDE, SIDE), characters if self.labels == "character" else alphabets, self.kind)

    def has_download(self) -> bool:
        """Not for the small sets: torchvision downloads the background and evaluation sets only."""
        return set(self.chosen()) <= set(DOWNLOADS)

    def expected_files(self) -> list[str]:
        return [f"{FOLDER}/{part}/<alphabet>/<character>/*.png" for part in self.chosen()]

    def load_files(self, root: Path, download: bool) -> Pool:
        """The folders in sorted order (torchvision's ``Omniglot`` numbers the characters in the order the file system
        lists them, which differs between machines: a deployment's nodes would disagree on the labels; PFLlib's
        clients take a character's drawings in that order too, where here a client is one drawer); ``download``
        fetches the downloads whose folder is not there."""
        if download:
            require("torchvision", why="dataset = 'omniglot' with download = true")
            from torchvision.datasets import Omniglot as Download

            for part in [p for p in self.chosen() if p in DOWNLOADS and not (Path(root) / FOLDER / p).is_dir()]:
                Download(str(root), background=part == "images_background", download=True)  # torchvision looks for its zip
        require_files(root, self.expected_files())
        characters = [c for part in self.chosen() for c in sorted((Path(root) / FOLDER / part).glob("*/*")) if c.is_dir()]
        alphabets = sorted({c.parent.name for c in characters})
        paths: list[Path] = []
        labels: list[int] = []
        for number, character in enumerate(characters):
            drawings = sorted(character.glob("*.png"))
            paths += drawings
            labels += [number if self.labels == "character" else alphabets.index(character.parent.name)] * len(drawings)
        drawers = np.asarray([f"drawer{p.stem.rsplit('_', 1)[-1]}" for p in paths], dtype=object)
        return Pool(read_images(paths, SIDE, grey=True), np.asarray(labels), groups=drawers)
