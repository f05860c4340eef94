"""Camelyon17-WILDS (Bándi et al. 2019; Koh et al. 2021), from the folder WILDS's own download leaves."""

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
from flower_pfl.experiment.datasets.base import DataSet, Pool, Where

FOLDER = "camelyon17_v1.0"
SIDE, HOSPITALS = 96, 5


@dataclass
class Camelyon17(DataSet):
    """Camelyon17-WILDS (Bándi et al. 2019; Koh et al. 2021): 455,954 colour 96x96 patches of lymph-node
    slides, tumour or not (2 classes); naturally one of the 5 hospitals per client (WILDS's train,
    validation and test parts pooled, as PFLlib)."""

    name = "camelyon17"
    kind = "image"
    natural = "hospital"
    files_text = f"WILDS's download `{FOLDER}/`: `metadata.csv`, `patches/patient_<p>_node_<n>/*.png`"

    per_hospital: int = param(5000, key="camelyon17-per-hospital", must=NON_NEGATIVE_INT,
                              doc="patches drawn from each hospital, seeded, before any image is read (0: all 455,954, "
                                  "12.6 GB as bytes, as PFLlib; 5,000: 0.7 GB)")

    def info(self) -> DataInfo:
        return DataInfo((3, SIDE, SIDE), 2, self.kind)

    def expected_files(self) -> list[str]:
        return [f"{FOLDER}/metadata.csv", f"{FOLDER}/patches/<patient_node>/*.png"]

    def pool(self, where: Where, num_partitions: int, seed: int) -> Pool:
        """Every hospital's patches, or ``camelyon17-per-hospital`` of each drawn with the run's data seed."""
        return self.read(Path(where.data_dir), seed)

    def load_files(self, root: Path, download: bool) -> Pool:
        """The patches as ``pool`` draws them with data seed 0."""
        return self.read(root, 0)

    def read(self, root: Path, seed: int) -> Pool:
        """The patches listed in ``metadata.csv`` (label: its ``tumor``; group: ``hospital<center>``), each
        hospital's drawn with ``seed`` where it has more than ``per_hospital``, in the file's order."""
        require_files(root, self.expected_files()[:1])
        folder = Path(root) / FOLDER
        path = folder / "metadata.csv"
        meta = read_metadata(path, ("patient", "node", "x_coord", "y_coord", "tumor", "center"))
        centers = integers(path, "center", meta["center"], range(HOSPITALS))
        tumour = integers(path, "tumor", meta["tumor"], range(2))
        keep = []
        for center in np.unique(centers):
            rows = np.flatnonzero(centers == center)
            if self.per_hospital and len(rows) > self.per_hospital:
                rows = np.sort(np.random.default_rng([seed, int(center)]).choice(rows, self.per_hospital, replace=False))
            keep.append(rows)
        index = np.sort(np.concatenate(keep))
        paths = []
        for i in index:
            patient, node, x, y = (meta[c][i] for c in ("patient", "node", "x_coord", "y_coord"))
            paths.append(folder / "patches" / f"patient_{patient}_node_{node}" / f"patch_patient_{patient}_node_{node}_x_{x}_y_{y}.png")
        require_listed(Path(root), self.expected_files()[:1], paths)
        return Pool(read_images(paths, SIDE), tumour[index], np.asarray([f"hospital{c}" for c in centers[index]], dtype=object))
