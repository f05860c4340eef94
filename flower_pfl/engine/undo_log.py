"""Copy-on-write snapshots of a disk store: the rows a store overwrites after a snapshot, as they were.

A snapshot costs one flush: nothing is copied then. Afterwards, the first time a row that existed at
the snapshot is overwritten, its old value is appended to ``undo-<token>.rows`` (float32) and its
position to ``undo-<token>.pos`` (int64), both fsynced before the row changes. Rolling back to a
snapshot writes those old values back, latest snapshots' logs first, so every row ends as it was
when that snapshot was taken; rows added after it are dropped with the index. The extra disk is the
rows changed between two snapshots; a log is deleted once a later snapshot is durably referenced
(``release``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np

_NAME = re.compile(r"undo-(\d+)\.pos")


class UndoLog:
    """The pre-images of one store folder's rows, by snapshot token."""

    def __init__(self, folder: Path, dim: int) -> None:
        self.folder, self.dim = folder, dim

    def _rows(self, token: int) -> Path:
        return self.folder / f"undo-{token}.rows"

    def _positions(self, token: int) -> Path:
        return self.folder / f"undo-{token}.pos"

    def tokens(self) -> list[int]:
        """The snapshots that have a log, oldest first."""
        return sorted(int(m.group(1)) for p in self.folder.glob("undo-*.pos") if (m := _NAME.fullmatch(p.name)))

    def start(self, token: int) -> None:
        """An empty log for snapshot ``token`` (a log already there is emptied)."""
        for path in (self._rows(token), self._positions(token)):
            path.write_bytes(b"")

    def append(self, token: int, positions: np.ndarray, rows: np.ndarray) -> None:
        """Log ``rows`` (their old values) at ``positions``, durably, before the caller overwrites them."""
        for path, data in ((self._rows(token), np.ascontiguousarray(rows, dtype=np.float32)),
                           (self._positions(token), np.ascontiguousarray(positions, dtype=np.int64))):
            with path.open("ab") as fh:  # rows first: positions without their rows are never read
                fh.write(data.tobytes())
                fh.flush()
                os.fsync(fh.fileno())

    def read(self, token: int) -> tuple[np.ndarray, np.ndarray]:
        """The positions logged for ``token`` and their old rows (empty if there is no log)."""
        if not self._positions(token).exists():
            return np.zeros(0, np.int64), np.zeros((0, self.dim), np.float32)
        positions = np.fromfile(self._positions(token), dtype=np.int64)
        rows = np.fromfile(self._rows(token), dtype=np.float32, count=len(positions) * self.dim)
        return positions, rows.reshape(len(positions), self.dim)

    def release(self, before: int) -> None:
        """Delete the logs of snapshots older than ``before``."""
        for token in self.tokens():
            if token < before:
                self.drop(token)

    def drop(self, token: int) -> None:
        self._rows(token).unlink(missing_ok=True)
        self._positions(token).unlink(missing_ok=True)
