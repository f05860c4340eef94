"""Columns of a publisher's CSV file (WILDS's ``metadata.csv``, GTSRB's semicolon-separated ground truth), read
with the ``csv`` module and checked: a missing column, a file without rows or a value out of range is named."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from flower_pfl.experiment.data.files import MalformedFile


def read_columns(path: Path, columns: Sequence[str], what: str, delimiter: str = ",") -> dict[str, list[str]]:
    """The ``columns`` of ``path`` (``what`` it should be, for the errors) as text, one entry per row;
    ``MalformedFile`` names a missing column, or a file without rows."""
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh, delimiter=delimiter, skipinitialspace=True)
        missing = [c for c in columns if c not in (reader.fieldnames or [])]
        if missing:
            raise MalformedFile(f"{path}: not {what}: it has no column {', '.join(missing)} "
                                f"(its header: {delimiter.join(reader.fieldnames or [])!r})")
        out: dict[str, list[str]] = {c: [] for c in columns}
        for row in reader:
            for c in columns:
                out[c].append(row[c])
    if not out[columns[0]]:
        raise MalformedFile(f"{path}: {what} without rows")
    return out


def integers(path: Path, column: str, values: Sequence[str | None], allowed: range) -> np.ndarray:
    """A column as int64; ``MalformedFile`` names the first row (1: the first after the header) whose value is
    not an integer in ``allowed``."""
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
