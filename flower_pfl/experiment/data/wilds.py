"""What the WILDS data sets (Koh et al. 2021) share: their ``metadata.csv``, read column by column with the
``csv`` module (neither ``wilds`` nor ``pandas`` needed)."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from flower_pfl.experiment.data.files import MalformedFile


def read_metadata(path: Path, columns: Sequence[str]) -> dict[str, list[str]]:
    """The ``columns`` of a WILDS ``metadata.csv`` as text, one entry per row; ``MalformedFile`` names a
    missing column, or a file without rows."""
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in columns if c not in (reader.fieldnames or [])]
        if missing:
            raise MalformedFile(f"{path}: not WILDS's metadata.csv: it has no column {', '.join(missing)} "
                                f"(its header: {','.join(reader.fieldnames or [])!r})")
        out: dict[str, list[str]] = {c: [] for c in columns}
        for row in reader:
            for c in columns:
                out[c].append(row[c])
    if not out[columns[0]]:
        raise MalformedFile(f"{path}: WILDS's metadata.csv without rows")
    return out


def integers(path: Path, column: str, values: Sequence[str | None], allowed: range) -> np.ndarray:
    """A metadata column as int64; ``MalformedFile`` names the first row (1: the first after the header)
    whose value is not an integer in ``allowed``."""
    out = np.empty(len(values), dtype=np.int64)
    for i, value in enumerate(values):
        try:
            number: int | None = int(value or "")  # None: a row cut short
        except ValueError:
            number = None
        if number is None or number not in allowed:
            raise MalformedFile(f"{path}: row {i + 1}: {column} = {value!r}, expected an integer in "
                                f"[{allowed.start}, {allowed.stop - 1}]")
        out[i] = number
    return out
