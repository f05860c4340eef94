"""A Flower Datasets partitioner over label counts: partition ``i`` holds client ``i``'s labels, as many of
each as its node counted in its training split. It lets Flower Datasets' figures
(``flwr_datasets.visualization``) draw the clients' data from what the nodes report, with no data on the
server. Needs Flower Datasets (the ``data`` extra): ``flower_pfl.engine.extras.require`` it before import.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from datasets import ClassLabel, Dataset, Features
from flwr_datasets.partitioner import Partitioner

#: the label column of the partitioner's data set
LABEL = "label"


class CountsPartitioner(Partitioner):
    """Partition ``i`` holds ``counts[i][c]`` rows of label ``c`` (a ``ClassLabel`` column ``label`` of
    ``len(counts[i])`` classes, so a label no client has still counts as zero); ``names``: the classes'
    names (default: their numbers)."""

    def __init__(self, counts: Sequence[Sequence[int]] | np.ndarray, names: Sequence[str] | None = None) -> None:
        super().__init__()
        table = np.asarray(counts, dtype=np.int64)
        if table.ndim != 2 or table.shape[1] == 0 or (table < 0).any():
            raise ValueError(f"label counts must be a clients x classes table of counts >= 0, not shape {table.shape}")
        clients, classes = table.shape
        self._ends = np.cumsum(table.sum(axis=1))
        labels = np.repeat(np.tile(np.arange(classes), clients), table.ravel())
        feature = ClassLabel(names=list(names)) if names is not None else ClassLabel(num_classes=classes)
        self.dataset = Dataset.from_dict({LABEL: labels}, features=Features({LABEL: feature})).with_format("arrow")

    @property
    def num_partitions(self) -> int:
        return len(self._ends)

    def load_partition(self, partition_id: int) -> Dataset:
        """Client ``partition_id``'s labels."""
        if not 0 <= partition_id < self.num_partitions:
            raise ValueError(f"partition_id {partition_id} is not one of the {self.num_partitions} partitions")
        start, end = int(self._ends[partition_id - 1]) if partition_id else 0, int(self._ends[partition_id])
        return self.dataset.select(range(start, end) if end > start else [])  # datasets refuses an empty range at the end
