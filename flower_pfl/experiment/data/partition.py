"""Partitions of a labelled data set over clients, and data scarcity.

The label-based schemes are Flower Datasets' partitioners (``flwr_datasets``, a
data library that does not depend on the Flower framework), applied to the label
array of any data set; every scheme is seeded.

- ``iid``: uniform random split.
- ``dirichlet``: label skew, per class a Dirichlet(alpha) share for each client;
  redrawn until every client has at least ``MIN_DIRICHLET_SIZE`` samples.
- ``pathological``: every client gets ``classes_per_client`` classes (client ``i``'s first
  class is ``i mod #classes``, so every class is used when there are enough clients).
- ``shards``: sort by label, cut into shards, ``shards_per_client`` shards each
  (McMahan et al.; IGFL's cross-silo split with 2 shards).

``paired``: clients ``2k`` and ``2k + 1`` split the ``k``-th partition of the scheme
at random, so every client has a twin with the same label distribution (IGFL's
"paired population", its Figure 2).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from flower_pfl.engine.extras import require

SCHEMES: tuple[str, ...] = ("iid", "dirichlet", "pathological", "shards")
MIN_DIRICHLET_SIZE = 10


def make_partitioner(scheme: str, num_partitions: int, *, label: str = "label", alpha: float = 0.5,
                     classes_per_client: int = 2, shards_per_client: int = 2, seed: int = 0) -> Any:
    """The Flower Datasets partitioner for ``scheme`` (partitioning by column ``label``)."""
    require("flwr_datasets", why=f"partition = {scheme!r}")
    from flwr_datasets.partitioner import DirichletPartitioner, IidPartitioner, PathologicalPartitioner, ShardPartitioner

    if num_partitions < 1:
        raise ValueError("num_partitions must be >= 1")
    if scheme == "iid":
        return IidPartitioner(num_partitions=num_partitions)
    if scheme == "dirichlet":
        return DirichletPartitioner(num_partitions=num_partitions, partition_by=label, alpha=alpha,
                                    min_partition_size=MIN_DIRICHLET_SIZE, self_balancing=False, seed=seed)
    if scheme == "pathological":
        return PathologicalPartitioner(num_partitions=num_partitions, partition_by=label,
                                       num_classes_per_partition=classes_per_client, seed=seed,
                                       class_assignment_mode="first-deterministic")
    if scheme == "shards":
        return ShardPartitioner(num_partitions=num_partitions, partition_by=label,
                                num_shards_per_partition=shards_per_client, seed=seed)
    raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")


def paired_groups(num_partitions: int) -> int:
    """How many partitions the scheme makes when clients come in twins."""
    return (num_partitions + 1) // 2


def twin_share(size: int, partition_id: int, num_partitions: int, seed: int = 0) -> np.ndarray:
    """The indices (into its group's ``size`` samples) client ``partition_id`` keeps when clients
    ``2k`` and ``2k + 1`` split group ``k`` at random; a client without a twin keeps all."""
    if partition_id == num_partitions - 1 and num_partitions % 2:
        return np.arange(size)
    perm = np.random.default_rng([seed, 3, partition_id // 2]).permutation(size)
    return np.sort(perm[: size // 2] if partition_id % 2 == 0 else perm[size // 2:])


def partition_indices(labels: np.ndarray, num_partitions: int, scheme: str, *, seed: int = 0, paired: bool = False,
                      **options: Any) -> list[np.ndarray]:
    """Sample indices of every partition: ``num_partitions`` arrays covering disjoint samples.

    ``options``: ``alpha``, ``classes_per_client``, ``shards_per_client`` (see ``make_partitioner``);
    ``paired``: clients come in twins that share one partition of the scheme.
    """
    require("flwr_datasets", "datasets", why=f"partition = {scheme!r}")
    from datasets import Dataset

    if paired:
        groups = partition_indices(labels, paired_groups(num_partitions), scheme, seed=seed, **options)
        return [groups[i // 2][twin_share(len(groups[i // 2]), i, num_partitions, seed)] for i in range(num_partitions)]

    part = make_partitioner(scheme, num_partitions, seed=seed, **options)
    labels = np.asarray(labels)
    # The partitioners cut each class (or the whole set) in index order; shuffle first, with the seed, so a
    # client's share of a class is a random sample of it (as FederatedDataset does), not the samples that
    # happen to come first (for pooled Synthetic data: the first users' samples).
    order = np.random.default_rng(seed).permutation(len(labels))
    part.dataset = Dataset.from_dict({"label": labels[order], "idx": order})
    return [np.asarray(part.load_partition(i)["idx"], dtype=np.int64) for i in range(num_partitions)]


def keep_train_samples(x: np.ndarray, y: np.ndarray, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Data scarcity: at most ``n`` training samples, drawn without replacement (``n = 0``: all)."""
    if n <= 0 or len(y) <= n:
        return x, y
    keep = np.sort(rng.choice(len(y), size=n, replace=False))
    return x[keep], y[keep]
