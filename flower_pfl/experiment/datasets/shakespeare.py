"""Shakespeare (LEAF, Caldas et al. 2018): next-character prediction, one speaking role per client."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from flower_pfl.experiment.data.hub import Hub
from flower_pfl.experiment.data.info import DataInfo
from flower_pfl.experiment.data.leaf import leaf_files, read_leaf_files
from flower_pfl.experiment.data.text import LEAF_LETTERS, UNKNOWN_LETTER, encode_letters
from flower_pfl.experiment.datasets.base import DataSet, Encoder, Pool

FOLDER = "shakespeare/data/all_data"
#: LEAF's window: 80 characters, then the next one to predict
WINDOW = 80


def leaf_pool(users: Sequence[str], xs: Sequence[str], ys: Sequence[str], test: Sequence[bool] | None = None) -> Pool:
    """Windows and next characters as a pool (``groups``: the speaking role; ``test``: LEAF's own test part,
    where its files give one); samples whose next character is not one of LEAF's letters are left out."""
    keep = [i for i, c in enumerate(ys) if c in LEAF_LETTERS and len(xs[i]) == WINDOW]
    labels = encode_letters([ys[i] for i in keep]).reshape(-1)
    return Pool(np.asarray([xs[i] for i in keep], dtype=object), labels, np.asarray([users[i] for i in keep], dtype=object),
                test=None if test is None else np.asarray([test[i] for i in keep], dtype=bool))


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
        return leaf_files(self.name)  # all_data/, or LEAF's train/ and test/

    def load_files(self, root: Path, download: bool) -> Pool:
        """LEAF's ``train/`` and ``test/`` output with LEAF's split kept (every training file before every test
        file, so each role's windows stay in time order), else ``all_data/`` split by the package in time; LEAF's
        train and test files put into ``all_data/`` are read as LEAF's split too (``flower_pfl.experiment.data.leaf``)."""
        return leaf_pool(*read_leaf_files(root, self.name))

    def from_hub(self, columns: Mapping[str, Sequence[Any]]) -> Pool:
        return leaf_pool([str(u) for u in columns["character_id"]], columns["x"], columns["y"])

    def encoder(self, train_parts: Sequence[np.ndarray]) -> Encoder:
        return lambda x: torch.as_tensor(encode_letters([str(t) for t in x]))
