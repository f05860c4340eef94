"""AG News (Zhang et al. 2015), from its archive's CSV files or the hub."""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from flower_pfl.engine.params import AT_LEAST_ONE, Rule, param
from flower_pfl.experiment.data.hub import Hub
from flower_pfl.experiment.data.info import DataInfo
from flower_pfl.experiment.data.text import PAD_ID, encode_words, word_vocabulary
from flower_pfl.experiment.datasets.base import DataSet, Encoder, Pool

FOLDER = "ag_news_csv"


@dataclass
class AGNews(DataSet):
    """AG News (Zhang et al. 2015): 127,600 news articles (title and description) of 4 topics (train and test
    pooled), as word ids of a vocabulary fitted on the clients' training text."""

    name = "ag-news"
    kind = "tokens"
    hub = Hub("fancyzhx/ag_news", x="text", y="label")
    files_text = f"the archive's `{FOLDER}/train.csv` and `test.csv` (class 1-4, title, description)"

    vocab_size: int = param(32000, key="text-vocab-size", must=Rule(lambda v: isinstance(v, int) and v >= 3, "an integer >= 3"),
                            doc="words in the vocabulary fitted on the clients' training text, padding and unknown included (PFLlib's 32,000)")
    seq_len: int = param(200, key="text-seq-len", must=AT_LEAST_ONE,
                         doc="tokens per text: longer ones are cut, shorter ones padded at the end (PFLlib's 200)")

    def info(self) -> DataInfo:
        return DataInfo((self.seq_len,), 4, self.kind, vocab_size=self.vocab_size, padding_id=PAD_ID)

    def expected_files(self) -> list[str]:
        return [f"{FOLDER}/train.csv", f"{FOLDER}/test.csv"]

    def load_files(self, root: Path, download: bool) -> Pool:
        texts, labels = [], []
        for part in ("train", "test"):
            path = Path(root) / FOLDER / f"{part}.csv"
            if not path.is_file():
                raise FileNotFoundError(f"no {FOLDER}/{part}.csv under {Path(root).resolve()}")
            with path.open(newline="", encoding="utf-8") as file:
                for row in csv.reader(file):
                    labels.append(int(row[0]) - 1)
                    texts.append(" ".join(row[1:]).replace("\\", " "))
        return Pool(np.asarray(texts, dtype=object), np.asarray(labels))

    def from_hub(self, columns: Mapping[str, Sequence[Any]]) -> Pool:
        return Pool(np.asarray(columns["text"], dtype=object), np.asarray(columns["label"]))

    def encoder(self, train_parts: Sequence[np.ndarray]) -> Encoder:
        """Word ids of the ``text-vocab-size`` most frequent words of every client's training part."""
        tokenizer = word_vocabulary((str(t) for part in train_parts for t in part), self.vocab_size)
        return lambda x: torch.as_tensor(encode_words(tokenizer, [str(t) for t in x], self.seq_len))
