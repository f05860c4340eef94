"""CelebA (LEAF, Caldas et al. 2018): is the celebrity smiling, one celebrity per client."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flower_pfl.experiment.data.files import require_listed
from flower_pfl.experiment.data.images import read_images
from flower_pfl.experiment.data.info import DataInfo
from flower_pfl.experiment.data.leaf import class_labels, leaf_files, read_leaf_files
from flower_pfl.experiment.datasets.base import DataSet, Pool

#: where LEAF's preprocessing and its CNN find the images (CelebA's img_align_celeba.zip unpacked)
IMAGES = "celeba/data/raw/img_align_celeba"
#: LEAF's CNN takes the images resized to 84 x 84, in colour
SIDE = 84


@dataclass
class CelebA(DataSet):
    """CelebA (LEAF, Caldas et al. 2018): colour face images resized to 84x84 as LEAF's CNN takes them, labelled
    Smiling or not (2 classes); naturally one celebrity per client (LEAF keeps those with 5 images or more).

    Read from LEAF's preprocessing output under ``data-dir`` (LEAF's ``data/`` folder): ``celeba/data/all_data/*.json``
    (users: celebrity ids; ``x``: image file names; ``y``: Smiling, 0 or 1), or its ``train/`` and ``test/`` split
    (``preprocess.sh ... -t sample``), whose split is kept; and the images it names in ``celeba/data/raw/img_align_celeba/``.
    Every image is read once, when the data are loaded (about 21 KB each at 84x84: some 4 GB for LEAF's full set of about 200,000)."""

    name = "celeba"
    kind = "image"
    natural = "celebrity"
    files_text = (f"LEAF's `celeba/data/all_data/*.json` (or its `train/` and `test/` split: users, user_data with x the "
                  f"image names and y Smiling 0/1) and the images `{IMAGES}/*.jpg`: CelebA's img_align_celeba.zip, "
                  "identity_CelebA.txt and list_attr_celeba.txt unpacked into `celeba/data/raw/`, then LEAF's `preprocess.sh`")

    def info(self) -> DataInfo:
        return DataInfo((3, SIDE, SIDE), 2, self.kind)

    def expected_files(self) -> list[str]:
        return [*leaf_files(self.name), f"{IMAGES}/*.jpg"]

    def load_files(self, root: Path, download: bool) -> Pool:
        """LEAF's JSON (``flower_pfl.experiment.data.leaf``) and the images it names; ``MissingFiles`` names the
        images that are not in ``celeba/data/raw/img_align_celeba/``."""
        root = Path(root)
        samples = read_leaf_files(root, self.name)
        paths = [root / IMAGES / str(x) for x in samples.x]
        require_listed(root, leaf_files(self.name), paths)
        labels = class_labels(samples.y, 2, root / self.name / "data")
        test = None if samples.test is None else np.asarray(samples.test, dtype=bool)
        return Pool(read_images(paths, side=SIDE), labels,
                    np.asarray(samples.users, dtype=object), test=test)
