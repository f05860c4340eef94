"""Image data sets through Flower Datasets' ``FederatedDataset`` (the Flower convention).

``source`` is a Hugging Face hub id (the defaults below; needs internet) or a local
folder holding the same data set (e.g. a download of it: parquet files under
``data/``). The ``train`` split is partitioned over clients; each client then splits
its own share into train and test, as with the other sources. FEMNIST is partitioned
naturally, one writer per client.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from flower_pfl.engine.extras import require

#: name -> (default hub id, image column, label column)
HUB: dict[str, tuple[str, str, str]] = {
    "fmnist": ("zalando-datasets/fashion_mnist", "image", "label"),
    "cifar10": ("uoft-cs/cifar10", "img", "label"),
    "femnist": ("flwrlabs/femnist", "image", "character"),
}
WRITER = "writer_id"


@lru_cache(maxsize=2)
def federated_dataset(name: str, source: str, scheme: str, num_partitions: int, options: tuple[tuple[str, Any], ...], seed: int) -> Any:
    """A ``FederatedDataset`` whose ``train`` split is partitioned by ``scheme`` (``natural``: by writer)."""
    require("flwr_datasets", "datasets", why="data-source = 'flwr-datasets'")
    from flwr_datasets import FederatedDataset
    from flwr_datasets.partitioner import NaturalIdPartitioner

    from flower_pfl.experiment.data.partition import make_partitioner

    if name not in HUB:
        raise ValueError(f"flwr-datasets source supports {sorted(HUB)}, not {name!r}")
    _, _, label = HUB[name]
    if scheme == "natural":
        if name != "femnist":
            raise ValueError(f"{name} has no natural partition; choose a label partition")
        partitioner = NaturalIdPartitioner(partition_by=WRITER)
    else:
        partitioner = make_partitioner(scheme, num_partitions, label=label, seed=seed, **dict(options))
    return FederatedDataset(dataset=source or HUB[name][0], partitioners={"train": partitioner}, seed=seed)


def load_hub_partition(name: str, source: str, scheme: str, partition_id: int, num_partitions: int,
                       options: dict[str, Any], seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Client ``partition_id``'s share as uint8 ``(n, C, H, W)`` images and int64 labels."""
    fds = federated_dataset(name, source, scheme, num_partitions, tuple(sorted(options.items())), seed)
    available = fds.partitioners["train"].num_partitions if scheme == "natural" else num_partitions
    if partition_id >= available:
        raise ValueError(f"{name} has {available} natural partitions; partition-id {partition_id} does not exist")
    part = fds.load_partition(partition_id, "train")
    _, image, label = HUB[name]
    x = np.stack([np.asarray(img) for img in part[image]]).astype(np.uint8)
    x = x[:, None] if x.ndim == 3 else x.transpose(0, 3, 1, 2)  # grey (n, H, W) or colour (n, H, W, C)
    return np.ascontiguousarray(x), np.asarray(part[label], dtype=np.int64)
