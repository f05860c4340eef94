"""COVIDx CXR (Wang et al. 2020; COVID-Net): chest X-rays, COVID-19 positive or negative, from its list files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flower_pfl.experiment.data.files import MalformedFile, require_files, require_listed
from flower_pfl.experiment.data.images import read_images
from flower_pfl.experiment.data.info import DataInfo
from flower_pfl.experiment.datasets.base import DataSet, Pool

FOLDER = "covidx"
#: the parts a release ships (CXR-2 has no val part), each a list file and a folder of images
PARTS = ("train", "val", "test")
#: the list files' class column, as labels
CLASSES = {"negative": 0, "positive": 1}
SIDE = 64


@dataclass
class COVIDx(DataSet):
    """COVIDx CXR-2 to CXR-4 (Wang et al. 2020; COVID-Net): chest X-rays of thousands of patients from several
    public sources, COVID-19 positive or negative (2 classes), resized to colour 64x64 as PFLlib does; the parts
    pooled (PFLlib also resamples its training positives to balance the classes; here a partition decides)."""

    name = "covidx"
    kind = "image"
    files_text = (f"the Kaggle archive's `train.txt`, `test.txt` (and `val.txt`) with the `train/`, `test/` (and `val/`) "
                  f"image folders, unpacked into `{FOLDER}/`")

    def info(self) -> DataInfo:
        return DataInfo((3, SIDE, SIDE), len(CLASSES), self.kind)

    def expected_files(self) -> list[str]:
        return [f"{FOLDER}/{part}.txt" for part in ("train", "test")]

    def load_files(self, root: Path, download: bool) -> Pool:
        """Each list file's lines: patient id, image file name, class, source (space-separated); every image it
        names must be in the part's folder."""
        require_files(root, self.expected_files())
        base = Path(root) / FOLDER
        paths: list[Path] = []
        labels: list[int] = []
        for part in PARTS:
            listing = base / f"{part}.txt"
            if not listing.is_file():
                continue
            for number, line in enumerate(listing.read_text().splitlines(), 1):
                fields = line.split()
                if not fields:
                    continue
                if len(fields) < 3 or fields[2] not in CLASSES:
                    raise MalformedFile(f"{listing}, line {number}: expected 'patient file class source' with class "
                                        f"{' or '.join(CLASSES)} (COVIDx CXR-2 or later), got {line.strip()!r}")
                paths.append(base / part / fields[1])
                labels.append(CLASSES[fields[2]])
        require_listed(Path(root), self.expected_files(), paths)
        return Pool(read_images(paths, SIDE), np.asarray(labels))
