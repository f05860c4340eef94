"""iWildCam2020-WILDS (Beery et al. 2020; Koh et al. 2021), from the folder WILDS's own download leaves."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flower_pfl.engine.params import NON_NEGATIVE_INT, param
from flower_pfl.experiment.data.columns import integers
from flower_pfl.experiment.data.files import require_files, require_listed
from flower_pfl.experiment.data.images import read_images
from flower_pfl.experiment.data.info import DataInfo
from flower_pfl.experiment.data.wilds import read_metadata
from flower_pfl.experiment.datasets.base import DataSet, Pool

FOLDER = "iwildcam_v2.0"
#: PFLlib's side; WILDS's labels (its ``y``: the categories seen in its training part, made contiguous)
SIDE, CLASSES = 64, 182
#: PFLlib keeps a camera trap with more than ``iwildcam-min-samples`` images of more than this many classes
MIN_CLASSES = 2


@dataclass
class IWildCam(DataSet):
    """iWildCam2020-WILDS (Beery et al. 2020; Koh et al. 2021): 203,029 camera-trap photos of 182 classes
    (WILDS's labels), resized to colour 64x64 as PFLlib; naturally one camera trap per client, the traps
    with more than 100 photos of more than 2 classes (WILDS's five parts pooled, as PFLlib)."""

    name = "iwildcam"
    kind = "image"
    natural = "camera trap"
    files_text = f"WILDS's download `{FOLDER}/`: `metadata.csv`, `train/*.jpg`"

    min_samples: int = param(100, key="iwildcam-min-samples", must=NON_NEGATIVE_INT,
                             doc="keep the camera traps with more than this many photos of more than 2 classes, as "
                                 "PFLlib (0: every trap)")

    def info(self) -> DataInfo:
        return DataInfo((3, SIDE, SIDE), CLASSES, self.kind)

    def expected_files(self) -> list[str]:
        return [f"{FOLDER}/metadata.csv", f"{FOLDER}/train/*.jpg"]

    def load_files(self, root: Path, download: bool) -> Pool:
        """The photos listed in ``metadata.csv`` (label: its ``y``; group: ``trap<location_remapped>``) of the
        traps kept, in the file's order."""
        require_files(root, self.expected_files()[:1])
        folder = Path(root) / FOLDER
        path = folder / "metadata.csv"
        meta = read_metadata(path, ("location_remapped", "y", "filename"))
        traps = integers(path, "location_remapped", meta["location_remapped"], range(2**31))
        labels = integers(path, "y", meta["y"], range(CLASSES))
        keep = np.ones(len(labels), dtype=bool)
        if self.min_samples:
            for trap in np.unique(traps):
                rows = traps == trap
                keep[rows] = rows.sum() > self.min_samples and len(np.unique(labels[rows])) > MIN_CLASSES
        index = np.flatnonzero(keep)
        paths = [folder / "train" / meta["filename"][i] for i in index]
        require_listed(Path(root), [f"{FOLDER}/metadata.csv"], paths)
        return Pool(read_images(paths, SIDE), labels[index], np.asarray([f"trap{t:03d}" for t in traps[index]], dtype=object))
