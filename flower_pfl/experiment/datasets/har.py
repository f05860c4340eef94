"""UCI Human Activity Recognition (Anguita et al. 2013), from its archive's layout."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flower_pfl.experiment.data.info import DataInfo
from flower_pfl.experiment.datasets.base import DataSet, Pool

FOLDER = "UCI HAR Dataset"
#: the nine inertial signals, in PFLlib's order: body acceleration, body gyroscope, total acceleration
SIGNALS = tuple(f"{kind}_{axis}" for kind in ("body_acc", "body_gyro", "total_acc") for axis in "xyz")
STEPS = 128


@dataclass
class HAR(DataSet):
    """UCI HAR (Anguita et al. 2013): 10,299 windows of 2.56 s (128 steps) of 9 inertial signals from a waist
    smartphone, 6 activities; naturally one of the 30 subjects per client (train and test parts pooled)."""

    name = "har"
    kind = "signals"
    natural = "subject"
    files_text = f"the archive's `{FOLDER}/{{train,test}}/`: `Inertial Signals/*.txt`, `y_*.txt`, `subject_*.txt`"

    def info(self) -> DataInfo:
        return DataInfo((len(SIGNALS), STEPS), 6, self.kind)

    def expected_files(self) -> list[str]:
        return [f"{FOLDER}/{part}/{name}" for part in ("train", "test")
                for name in (*(f"Inertial Signals/{s}_{part}.txt" for s in SIGNALS), f"y_{part}.txt", f"subject_{part}.txt")]

    def load_files(self, root: Path, download: bool) -> Pool:
        """Each window as ``(9, 128)``: one row per signal (PFLlib reshapes the time-major ``(128, 9)`` without
        transposing, which interleaves the signals; here each row is one signal)."""
        folder = Path(root) / FOLDER
        parts = []
        for part in ("train", "test"):
            missing = [f for f in self.expected_files() if f"/{part}/" in f and not (Path(root) / f).is_file()]
            if missing:
                raise FileNotFoundError(f"missing under {Path(root).resolve()}: {', '.join(missing)}")
            signals = np.stack([np.loadtxt(folder / part / "Inertial Signals" / f"{s}_{part}.txt", dtype=np.float32, ndmin=2)
                                for s in SIGNALS], axis=1)
            labels = np.loadtxt(folder / part / f"y_{part}.txt", dtype=np.int64, ndmin=1) - 1
            subjects = np.loadtxt(folder / part / f"subject_{part}.txt", dtype=np.int64, ndmin=1)
            parts.append(Pool(signals, labels, np.asarray([f"subject{s:02d}" for s in subjects], dtype=object)))
        return Pool.join(parts)
