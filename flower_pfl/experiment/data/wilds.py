"""What the WILDS data sets (Koh et al. 2021) share: their ``metadata.csv``, read column by column with the
``csv`` module (neither ``wilds`` nor ``pandas`` needed)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from flower_pfl.experiment.data.columns import read_columns


def read_metadata(path: Path, columns: Sequence[str]) -> dict[str, list[str]]:
    """The ``columns`` of a WILDS ``metadata.csv`` as text, one entry per row; ``MalformedFile`` names a
    missing column, or a file without rows."""
    return read_columns(path, columns, "WILDS's metadata.csv")
