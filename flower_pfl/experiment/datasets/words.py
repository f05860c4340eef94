"""Text classification data sets as word ids, and the CSV archives of Zhang et al. (2015) that several ship as."""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from flower_pfl.engine.params import AT_LEAST_ONE, Rule, param
from flower_pfl.experiment.data.files import MalformedFile, require_files
from flower_pfl.experiment.data.info import DataInfo
from flower_pfl.experiment.data.text import PAD_ID, encode_words, word_vocabulary
from flower_pfl.experiment.datasets.base import DataSet, Encoder, Pool


@dataclass
class WordTexts(DataSet):
    """Texts of ``classes`` labels as word ids of a vocabulary fitted on the clients' training text
    (``text-vocab-size`` words, ``text-seq-len`` ids per text); the pool's ``x`` holds the raw strings."""

    kind = "tokens"
    classes: ClassVar[int]

    vocab_size: int = param(32000, key="text-vocab-size", must=Rule(lambda v: isinstance(v, int) and v >= 3, "an integer >= 3"),
                            doc="words in the vocabulary fitted on the clients' training text, padding and unknown included (PFLlib's 32,000)")
    seq_len: int = param(200, key="text-seq-len", must=AT_LEAST_ONE,
                         doc="tokens per text: longer ones are cut, shorter ones padded at the end (PFLlib's 200)")

    def info(self) -> DataInfo:
        return DataInfo((self.seq_len,), self.classes, self.kind, vocab_size=self.vocab_size, padding_id=PAD_ID)

    def encoder(self, train_parts: Sequence[np.ndarray]) -> Encoder:
        """Word ids of the ``text-vocab-size`` most frequent words of every client's training part."""
        tokenizer = word_vocabulary((str(t) for part in train_parts for t in part), self.vocab_size)
        return lambda x: torch.as_tensor(encode_words(tokenizer, [str(t) for t in x], self.seq_len))


@dataclass
class NewsArchive(WordTexts):
    """One of Zhang et al.'s (2015) text classification archives: ``<folder>/train.csv`` and ``test.csv``, rows of
    a class (1 to ``classes``) and text fields (title, then description or content), read as one text each (the
    parts pooled); or the hub's columns (its ``more`` columns, then its ``x``, joined into one text)."""

    folder: ClassVar[str]

    def expected_files(self) -> list[str]:
        return [f"{self.folder}/train.csv", f"{self.folder}/test.csv"]

    def load_files(self, root: Path, download: bool) -> Pool:
        require_files(root, self.expected_files())
        texts, labels = [], []
        for name in self.expected_files():
            path = Path(root) / name
            with path.open(newline="", encoding="utf-8") as file:
                for line, row in enumerate(csv.reader(file), 1):
                    if len(row) < 2 or not row[0].isdigit() or not 1 <= int(row[0]) <= self.classes:
                        raise MalformedFile(f"{path}, line {line}: expected a class 1-{self.classes} and the text's fields, "
                                            f"got {row[:2]!r}")
                    labels.append(int(row[0]) - 1)
                    texts.append(" ".join(row[1:]).replace("\\n", " ").replace("\\", " "))
        return Pool(np.asarray(texts, dtype=object), np.asarray(labels))

    def from_hub(self, columns: Mapping[str, Sequence[Any]]) -> Pool:
        spec = self.hub_spec()
        assert spec is not None
        texts = [" ".join(str(c) for c in row) for row in zip(*(columns[name] for name in (*spec.more, spec.x)))]
        return Pool(np.asarray(texts, dtype=object), np.asarray(columns[spec.y]))
