"""Data sets from the Hugging Face hub, through ``datasets`` (the library Flower Datasets is built on).

``source`` is a hub id (each data set declares its default, ``Hub``; reading it needs internet) or a
local folder holding the same data set (a download of the hub's files: parquet files under ``data/``,
named by split). Every labelled split the data set declares that the source has is read and pooled;
the experiment then partitions the pool over clients, as it does with local files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flower_pfl.engine.extras import require

#: split names the hub writes in two ways
_ALIASES = {"valid": "validation", "val": "validation", "dev": "validation"}


@dataclass(frozen=True)
class Hub:
    """A data set on the hub: its ``id`` (and ``config``), the sample column ``x``, the label column ``y``,
    the natural-client column ``group`` (``""``: none), the labelled ``splits`` pooled (``train`` first), and
    ``more`` columns the data set reads besides (a title before the text)."""

    id: str
    x: str
    y: str
    group: str = ""
    config: str | None = None
    splits: tuple[str, ...] = ("train", "test")
    more: tuple[str, ...] = ()


def _split_name(name: str) -> str:
    return _ALIASES.get(name, name)


def load_hub_columns(spec: Hub, source: str = "") -> dict[str, list[Any]]:
    """The columns ``x``, ``y`` (and ``group``) of every split of ``spec.splits`` that ``source`` (default:
    ``spec.id``) has, one split after the other. ``FileNotFoundError`` when the source cannot be read or
    has no ``train`` split; ``KeyError`` naming a missing column."""
    require("datasets", why=f"data-source = 'huggingface' ({spec.id})")
    from datasets import load_dataset

    path = source or spec.id
    try:
        splits = load_dataset(path, spec.config) if spec.config else load_dataset(path)
    except Exception as err:  # datasets raises its own errors for a missing folder, an unknown id, no network
        local = Path(path).exists() or Path(path).expanduser().is_absolute() or path.startswith((".", "~"))
        where = f"the local folder {str(Path(path).expanduser().resolve())!r}" if local else f"hub id {path!r}"
        raise FileNotFoundError(f"{spec.id} could not be read from {where} ({type(err).__name__}: {err})") from err
    names = {_split_name(name): name for name in splits}
    present = [names[_split_name(s)] for s in spec.splits if _split_name(s) in names]
    if not present or _split_name(spec.splits[0]) not in names:
        raise FileNotFoundError(f"{path} has no {spec.splits[0]!r} split (it has {sorted(splits)})")
    columns = [c for c in (spec.x, spec.y, spec.group, *spec.more) if c]
    out: dict[str, list[Any]] = {c: [] for c in columns}
    for name in present:
        part = splits[name]
        if missing := [c for c in columns if c not in part.column_names]:
            raise KeyError(f"{path} split {name!r} has no column {missing[0]!r} (it has {part.column_names})")
        for c in columns:
            out[c].extend(part[c])
    return out
