"""Sentiment140 (LEAF, Caldas et al. 2018): a tweet's sentiment, one Twitter user per client."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flower_pfl.experiment.data.files import MalformedFile
from flower_pfl.experiment.data.leaf import class_labels, leaf_files, read_leaf_files
from flower_pfl.experiment.datasets.base import Pool
from flower_pfl.experiment.datasets.words import WordTexts

#: the field of LEAF's ``x`` that holds the tweet: ``x`` is the row of Sentiment140's CSV after its polarity
#: (tweet id, date, query, user, text) and the part it came from (``training`` or ``test``)
TEXT = 4


@dataclass
class Sent140(WordTexts):
    """Sentiment140 (LEAF, Caldas et al. 2018): tweets labelled negative or positive (2 classes; LEAF labels the
    few neutral tweets of Sentiment140's test file negative), as word ids of a vocabulary fitted on the clients'
    training text; naturally one Twitter user per client.

    Read from LEAF's preprocessing output under ``data-dir`` (LEAF's ``data/`` folder): ``sent140/data/all_data/*.json``
    (users: Twitter user names; ``x``: the tweet's fields, its text the fifth; ``y``: 0 or 1), or its ``train/``
    and ``test/`` split (``preprocess.sh ... -t sample``), whose split is kept. LEAF's stacked LSTM reads 25 words
    of each tweet (``text-seq-len = 25`` for its setting; the key's default, 200, is the one every text set shares)
    with GloVe's vocabulary; here the vocabulary is fitted on the training text."""

    name = "sent140"
    natural = "user"
    classes = 2
    files_text = ("LEAF's `sent140/data/all_data/*.json` (or its `train/` and `test/` split: users, user_data with x "
                  "the tweet's fields and y 0/1), which LEAF's `data/sent140/preprocess.sh` writes from Sentiment140's "
                  "trainingandtestdata.zip")

    def expected_files(self) -> list[str]:
        return leaf_files(self.name)

    def load_files(self, root: Path, download: bool) -> Pool:
        """LEAF's JSON (``flower_pfl.experiment.data.leaf``): each sample's tweet text, label and user."""
        samples = read_leaf_files(root, self.name)
        where = Path(root) / self.name / "data"
        bad = [x for x in samples.x if not isinstance(x, list) or len(x) <= TEXT or not isinstance(x[TEXT], str)]
        if bad:
            raise MalformedFile(f"{where}: LEAF's x must be a tweet's fields (id, date, query, user, text, ...); found {bad[0]!r}")
        texts = np.asarray([x[TEXT] for x in samples.x], dtype=object)
        test = None if samples.test is None else np.asarray(samples.test, dtype=bool)
        return Pool(texts, class_labels(samples.y, self.classes, where), np.asarray(samples.users, dtype=object), test=test)
