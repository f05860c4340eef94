"""Amazon Review (Blitzer et al. 2007, as Chen et al. 2012 ship it) under feature shift: one product domain per client."""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flower_pfl.experiment.data.files import MalformedFile, require_files
from flower_pfl.experiment.data.info import DataInfo
from flower_pfl.experiment.datasets.base import DataSet, Pool

FILE = "AmazonReview/amazon.npz"
#: the product domains, in the order of the file's offsets
DOMAINS = ("books", "dvd", "electronics", "kitchen")
#: the bag-of-words features kept: the file's first 5,000 (its most frequent unigrams and bigrams)
FEATURES = 5000
KEYS = ("xx_data", "xx_row", "xx_col", "xx_shape", "yy", "offset")


@dataclass
class AmazonReview(DataSet):
    """Amazon Review (Blitzer et al. 2007; Chen et al. 2012's features): 27,677 product reviews of four domains
    (books, DVDs, electronics, kitchen appliances) as counts of 5,000 unigrams and bigrams, positive or negative;
    client i holds domain i mod 4 (PFLlib's setting: one domain per client)."""

    name = "amazon-review"
    kind = "features"
    natural = "domain"
    files_text = f"PFLlib's `{FILE}` (its AmazonReview.zip unpacked: Chen et al.'s sparse counts, labels and domain offsets)"

    def info(self) -> DataInfo:
        return DataInfo((FEATURES,), 2, self.kind)

    def expected_files(self) -> list[str]:
        return [FILE]

    def load_files(self, root: Path, download: bool) -> Pool:
        """The sparse matrix is stored feature by sample (``xx_row``: feature, ``xx_col``: review); labels -1/+1
        as 0/1; ``offset`` bounds each domain's reviews."""
        require_files(root, self.expected_files())
        path = Path(root) / FILE
        try:
            with np.load(path) as npz:
                data, feature, review, shape, yy, offset = (np.asarray(npz[k]) for k in KEYS)
        except (KeyError, ValueError, OSError, zipfile.BadZipFile) as err:
            raise MalformedFile(f"{path}: not PFLlib's amazon.npz ({', '.join(KEYS)}): {err}") from err
        bounds = offset.reshape(-1).astype(np.int64)
        reviews = int(shape.reshape(-1)[1])
        labels = yy.reshape(-1)
        if len(bounds) != len(DOMAINS) + 1 or bounds[-1] != reviews or len(labels) != reviews or not np.isin(labels, (-1, 1)).all():
            raise MalformedFile(f"{path}: expected {len(DOMAINS) + 1} domain offsets ending at the {reviews} reviews, and one label "
                                f"-1 or 1 each; got offsets {bounds.tolist()} and {len(labels)} labels")
        x = np.zeros((reviews, FEATURES), np.float32)
        kept = feature < FEATURES
        np.add.at(x, (review[kept].astype(np.int64), feature[kept].astype(np.int64)), data[kept].astype(np.float32))
        domains = np.repeat(np.asarray(DOMAINS, dtype=object), np.diff(bounds))
        return Pool(x, ((labels + 1) // 2).astype(np.int64), domains=domains)
