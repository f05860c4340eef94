"""Shakespeare (LEAF, Caldas et al. 2018): next-character prediction, one speaking role per client."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from flower_pfl.experiment.data.files import MalformedFile, MissingFiles
from flower_pfl.experiment.data.hub import Hub
from flower_pfl.experiment.data.info import DataInfo
from flower_pfl.experiment.data.text import LEAF_LETTERS, UNKNOWN_LETTER, encode_letters
from flower_pfl.experiment.datasets.base import DataSet, Encoder, Pool

FOLDER = "shakespeare/data/all_data"
#: LEAF's preprocessing output split into train and test (``./preprocess.sh ... -t sample``), its split kept
SPLIT_FOLDERS = ("shakespeare/data/train", "shakespeare/data/test")
#: the name LEAF's split gives its files: ``all_data_niid_0_keep_0_train_9.json``, ``..._test_9.json``
_SPLIT_FILE = re.compile(r"_(train|test)_[0-9.]+\.json$")
#: LEAF's window: 80 characters, then the next one to predict
WINDOW = 80


def leaf_pool(users: Sequence[str], xs: Sequence[str], ys: Sequence[str], test: Sequence[bool] | None = None) -> Pool:
    """Windows and next characters as a pool (``groups``: the speaking role; ``test``: LEAF's own test part,
    where its files give one); samples whose next character is not one of LEAF's letters are left out."""
    keep = [i for i, c in enumerate(ys) if c in LEAF_LETTERS and len(xs[i]) == WINDOW]
    labels = encode_letters([ys[i] for i in keep]).reshape(-1)
    return Pool(np.asarray([xs[i] for i in keep], dtype=object), labels, np.asarray([users[i] for i in keep], dtype=object),
                test=None if test is None else np.asarray([test[i] for i in keep], dtype=bool))


def read_leaf(files: Sequence[tuple[Path, bool | None]]) -> Pool:
    """LEAF's JSON files (``users``, ``user_data`` with ``x`` and ``y``) read in the order given, each with
    whether it holds LEAF's test part (``None``: no split, ``all_data``)."""
    users: list[str] = []
    xs: list[str] = []
    ys: list[str] = []
    test: list[bool] = []
    for path, is_test in files:
        try:
            data = json.loads(path.read_text())
            parts = [(user, data["user_data"][user]) for user in data["users"]]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise MalformedFile(f"{path}: not LEAF's JSON (users, user_data with x and y): {type(err).__name__}: {err}") from err
        for user, samples in parts:
            users += [user] * len(samples["y"])
            xs += samples["x"]
            ys += samples["y"]
            test += [bool(is_test)] * len(samples["y"])
    return leaf_pool(users, xs, ys, test if any(t is not None for _, t in files) else None)


@dataclass
class Shakespeare(DataSet):
    """Shakespeare (LEAF, Caldas et al. 2018): 80-character windows of the plays' lines and the next character
    (80 classes, LEAF's letters); naturally one speaking role (a character in a play) per client, each split in
    time as LEAF splits it."""

    name = "shakespeare"
    kind = "tokens"
    natural = "speaking role"
    schemes = ("iid",)
    hub = Hub("flwrlabs/shakespeare", x="x", y="y", group="character_id", splits=("train",))
    temporal_split, split_gap = True, WINDOW - 1
    files_text = f"LEAF's `{FOLDER}/*.json` (its preprocessing's output: users, user_data with x and y)"

    def info(self) -> DataInfo:
        return DataInfo((WINDOW,), len(LEAF_LETTERS), self.kind, vocab_size=UNKNOWN_LETTER + 1)

    def expected_files(self) -> list[str]:
        return ["shakespeare/data/*/*.json"]  # all_data/, or LEAF's train/ and test/

    def load_files(self, root: Path, download: bool) -> Pool:
        """LEAF's ``train/`` and ``test/`` output with LEAF's split kept (every training file before every test
        file, so each role's windows stay in time order), else ``all_data/`` split by the package in time; LEAF's
        train and test files put into ``all_data/`` are read as LEAF's split too."""
        data = Path(root) / "shakespeare" / "data"
        train, test = (sorted((Path(root) / f).glob("*.json")) for f in SPLIT_FOLDERS)
        if train or test:
            if not (train and test):
                found, missing = (SPLIT_FOLDERS[0], SPLIT_FOLDERS[1]) if train else (SPLIT_FOLDERS[1], SPLIT_FOLDERS[0])
                raise MissingFiles(Path(root), [f"{found}/*.json"], [f"{missing}/*.json"])
            return read_leaf([(p, False) for p in train] + [(p, True) for p in test])
        files = sorted((data / "all_data").glob("*.json"))
        if not files:
            raise FileNotFoundError(f"no {FOLDER}/*.json (nor LEAF's {SPLIT_FOLDERS[0]}/ and {SPLIT_FOLDERS[1]}/) under "
                                    f"{Path(root).resolve()}")
        kinds = [_SPLIT_FILE.search(p.name) for p in files]
        if all(kinds):
            split = [(p, k.group(1) == "test") for p, k in zip(files, kinds) if k]
            split.sort(key=lambda pk: pk[1])  # every training file first: each role's windows in time order
            return read_leaf(split)
        return read_leaf([(p, None) for p in files])

    def from_hub(self, columns: Mapping[str, Sequence[Any]]) -> Pool:
        return leaf_pool([str(u) for u in columns["character_id"]], columns["x"], columns["y"])

    def encoder(self, train_parts: Sequence[np.ndarray]) -> Encoder:
        return lambda x: torch.as_tensor(encode_letters([str(t) for t in x]))
