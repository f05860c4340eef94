"""PAMAP2 Physical Activity Monitoring (Reiss and Stricker 2012), from UCI's archive layout."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flower_pfl.experiment.data.files import MalformedFile, require_files
from flower_pfl.experiment.data.info import DataInfo
from flower_pfl.experiment.datasets.base import DataSet, Pool

FOLDER = "PAMAP2_Dataset"
SUBJECTS = tuple(range(101, 110))
#: a ``.dat`` line: timestamp, activity id, heart rate, then 17 columns of each IMU (hand, chest, ankle)
COLUMNS, ACTIVITY = 54, 1
#: PFLlib's 27 signals: of each IMU (its first column: 3, 20, 37), 16g acceleration, gyroscope, magnetometer (x, y, z)
SIGNAL_COLUMNS = tuple(imu + offset for imu in (3, 20, 37) for offset in (1, 2, 3, 7, 8, 9, 10, 11, 12))
#: PFLlib's 12 activities, label i being activity ``ACTIVITIES[i]``: rope jumping, lying, sitting, standing,
#: walking, running, cycling, Nordic walking, ascending and descending stairs, vacuum cleaning, ironing
ACTIVITIES = (24, 1, 2, 3, 4, 5, 6, 7, 12, 13, 16, 17)
#: a window's steps (2.56 s at 100 Hz) and how far the next one starts
STEPS, STRIDE = 256, 128


def read_dat(path: Path) -> np.ndarray:
    """A subject's ``.dat`` file as float32 ``(rows, 54)`` (``NaN`` where a reading is missing)."""
    try:
        table = np.loadtxt(path, dtype=np.float32, ndmin=2)
    except ValueError as err:
        raise MalformedFile(f"{path}: not a PAMAP2 .dat file ({COLUMNS} space-separated numbers a line): {err}") from err
    if table.shape[1] != COLUMNS:
        raise MalformedFile(f"{path}: {table.shape[1]} columns a line, PAMAP2's .dat files have {COLUMNS}")
    activity = table[:, ACTIVITY]
    if not np.isfinite(activity).all() or (activity != np.round(activity)).any():
        raise MalformedFile(f"{path}: column 2 (the activity id) holds a value that is not an integer")
    return table


def bout_windows(activity: np.ndarray) -> list[tuple[int, int]]:
    """The windows that lie within one bout of a kept activity (a run of rows of one id): each bout's steps
    from its first row on, every ``STRIDE``; each window's first row and label."""
    cuts = np.flatnonzero(np.diff(activity)) + 1
    out = []
    for start, stop in zip(np.concatenate([[0], cuts]), np.concatenate([cuts, [len(activity)]])):
        if int(activity[start]) in ACTIVITIES:
            label = ACTIVITIES.index(int(activity[start]))
            out += [(int(first), label) for first in range(start, stop - STEPS + 1, STRIDE)]
    return out


@dataclass
class PAMAP2(DataSet):
    """PAMAP2 (Reiss and Stricker 2012): windows of 2.56 s (256 steps) of 27 signals of three IMUs (hand,
    chest, ankle), 12 activities, as PFLlib; naturally one of the 9 subjects per client.

    Each window is ``(27, 256)``, one row per signal (PFLlib's ``(9, 3, 256)``: sensor axis, IMU, time), its
    readings' ``NaN`` read as 0 and each signal divided by its largest absolute value over the subject's
    files (both, where the subject has an ``Optional`` one), as PFLlib. Unlike PFLlib, which cuts the
    subject's files put together every 128 steps and labels a window by the smallest activity id in it (a
    window across a change of activity takes one of the two; one across the files' seam mixes two
    recordings), a window here lies within one bout of one activity: each bout is cut every 128 steps from its
    first row (a bout shorter than 256 steps gives none)."""

    name = "pamap2"
    kind = "signals"
    natural = "subject"
    files_text = f"UCI's archive `{FOLDER}/Protocol/subject10<i>.dat` (and `Optional/` where a subject has it)"

    def info(self) -> DataInfo:
        return DataInfo((len(SIGNAL_COLUMNS), STEPS), len(ACTIVITIES), self.kind)

    def expected_files(self) -> list[str]:
        return [f"{FOLDER}/Protocol/subject{s}.dat" for s in SUBJECTS]

    def load_files(self, root: Path, download: bool) -> Pool:
        require_files(root, self.expected_files())
        return Pool.join([self.subject(Path(root) / FOLDER, s) for s in SUBJECTS])

    def subject(self, folder: Path, subject: int) -> Pool:
        """One subject's windows (group ``subject<id>``), protocol first, then optional activities."""
        files = [p for p in (folder / "Protocol" / f"subject{subject}.dat", folder / "Optional" / f"subject{subject}.dat") if p.is_file()]
        tables = [read_dat(p) for p in files]
        signals = [np.nan_to_num(t[:, SIGNAL_COLUMNS], nan=0.0) for t in tables]
        largest = np.max([np.abs(s).max(axis=0, initial=0.0) for s in signals], axis=0)
        scale = np.where(largest > 0, largest, 1).astype(np.float32)  # a signal never read stays 0
        x, y = [], []
        for table, s in zip(tables, signals):
            for first, label in bout_windows(table[:, ACTIVITY]):
                x.append((s[first:first + STEPS] / scale).T)
                y.append(label)
        windows = np.stack(x).astype(np.float32) if x else np.zeros((0, len(SIGNAL_COLUMNS), STEPS), np.float32)
        return Pool(windows, np.asarray(y, dtype=np.int64), np.full(len(y), f"subject{subject}", dtype=object))
