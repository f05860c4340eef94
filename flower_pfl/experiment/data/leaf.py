"""LEAF's JSON files (Caldas et al. 2018) as its preprocessing writes them under ``<name>/data/``: every file
an object of ``users``, ``num_samples`` and ``user_data`` (each user's ``x`` and ``y``).

``preprocess.sh`` writes ``all_data/*.json`` first and, with ``-t sample``, its split of each user's samples
into ``train/*.json`` and ``test/*.json`` (``..._train_9.json``, ``..._test_9.json``). ``read_leaf_files``
reads the split where it is there, keeping it, else ``all_data/`` (where LEAF's train and test files put
together are read as its split too), and gives every sample's user, ``x``, ``y`` and whether it is in LEAF's
test part, for each data set to build its pool from.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from flower_pfl.experiment.data.files import MalformedFile, MissingFiles

#: the name LEAF's split gives its files: ``all_data_niid_0_keep_0_train_9.json``, ``..._test_9.json``
_SPLIT_FILE = re.compile(r"_(train|test)_[0-9.]+\.json$")


class LeafSamples(NamedTuple):
    """Every sample of LEAF's files, in file order: its user, ``x`` and ``y`` as the JSON has them, and whether
    it is in LEAF's test part (``test``: ``None`` when the files hold no split)."""

    users: list[str]
    x: list[Any]
    y: list[Any]
    test: list[bool] | None


def leaf_files(name: str) -> list[str]:
    """What ``read_leaf_files`` reads of data set ``name`` (relative to ``data-dir``): ``all_data/``, or LEAF's
    ``train/`` and ``test/``."""
    return [f"{name}/data/*/*.json"]


def read_leaf_files(root: Path, name: str) -> LeafSamples:
    """LEAF's ``<name>/data/train/`` and ``test/`` output with LEAF's split kept (every training file before every
    test file, so a user's samples keep their order), else ``<name>/data/all_data/``: its train and test files
    as LEAF's split, any other files as no split. ``MissingFiles`` when only one part of the split is there,
    ``FileNotFoundError`` when no file is, ``MalformedFile`` for a file that is not LEAF's JSON."""
    root = Path(root)
    folders = (f"{name}/data/train", f"{name}/data/test")
    train, test = (sorted((root / f).glob("*.json")) for f in folders)
    if train or test:
        if not (train and test):
            found, missing = folders if train else folders[::-1]
            raise MissingFiles(root, [f"{found}/*.json"], [f"{missing}/*.json"])
        return read_leaf([(p, False) for p in train] + [(p, True) for p in test])
    files = sorted((root / name / "data" / "all_data").glob("*.json"))
    if not files:
        raise FileNotFoundError(f"no {name}/data/all_data/*.json (nor LEAF's {folders[0]}/ and {folders[1]}/) under "
                                f"{root.resolve()}")
    kinds = [_SPLIT_FILE.search(p.name) for p in files]
    if all(kinds):
        split = [(p, k.group(1) == "test") for p, k in zip(files, kinds) if k]
        split.sort(key=lambda pk: pk[1])  # every training file first: each user's samples in order
        return read_leaf(split)
    return read_leaf([(p, None) for p in files])


def read_leaf(files: Sequence[tuple[Path, bool | None]]) -> LeafSamples:
    """LEAF's JSON files read in the order given, each with whether it holds LEAF's test part (``None``: no
    split, ``all_data``)."""
    users: list[str] = []
    xs: list[Any] = []
    ys: list[Any] = []
    test: list[bool] = []
    for path, is_test in files:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            parts = [(str(user), data["user_data"][user]) for user in data["users"]]
            for user, samples in parts:
                if len(samples["x"]) != len(samples["y"]):
                    raise ValueError(f"user {user!r} has {len(samples['x'])} x and {len(samples['y'])} y")
        except (KeyError, TypeError, ValueError) as err:  # ValueError: bad JSON or UTF-8 too
            raise MalformedFile(f"{path}: not LEAF's JSON (users, user_data with x and y): {type(err).__name__}: {err}") from err
        for user, samples in parts:
            users += [user] * len(samples["y"])
            xs += samples["x"]
            ys += samples["y"]
            test += [bool(is_test)] * len(samples["y"])
    return LeafSamples(users, xs, ys, test if any(t is not None for _, t in files) else None)


def class_labels(y: Sequence[Any], classes: int, where: Path) -> np.ndarray:
    """LEAF's ``y`` as int64 class ids ``0..classes-1`` (CelebA writes them as floats, ``1.0``); ``MalformedFile``
    naming ``where`` (the files' folder) and what was found otherwise."""
    try:
        labels = np.asarray(y, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError) as err:
        raise MalformedFile(f"{where}: LEAF's y must be class ids 0-{classes - 1}: {err}") from err
    bad = (labels != np.round(labels)) | (labels < 0) | (labels >= classes)
    if bad.any():
        raise MalformedFile(f"{where}: LEAF's y must be class ids 0-{classes - 1}; found {sorted(set(labels[bad].tolist()))[:5]}")
    return labels.astype(np.int64)
