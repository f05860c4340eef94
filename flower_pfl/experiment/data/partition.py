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


class TooFewClients(ValueError):
    """A natural partition asked for ``asked`` clients where the data hold ``available`` natural clients or
    domains (``what`` they are); whoever knows where the number of clients came from names it."""

    def __init__(self, available: int, what: str, asked: int) -> None:
        self.available, self.asked = available, asked
        super().__init__(f"the data set has {available} {what}, fewer than the {asked} clients asked for")


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


def natural_partition(groups: np.ndarray, num_partitions: int, min_size: int = 2) -> tuple[list[np.ndarray], list[str]]:
    """One client per natural group (writer, speaking role, subject): the groups with at least ``min_size``
    samples, in sorted order, the first ``num_partitions`` of them; each client's sample indices (in data
    order) and its group's name. A ``ValueError`` when there are fewer such groups than clients."""
    names, inverse = np.unique(np.asarray(groups), return_inverse=True)  # numbers in numeric order, names in sorted order
    sizes = np.bincount(inverse, minlength=len(names))
    usable = [g for g in range(len(names)) if sizes[g] >= min_size]
    if num_partitions > len(usable):
        small = (f" ({len(names) - len(usable)} more have fewer than {min_size} samples, too few for a training part and a "
                 "test part of min-test-samples)") if len(usable) < len(names) else ""
        raise TooFewClients(len(usable), f"natural clients{small}", num_partitions)
    order = np.argsort(inverse, kind="stable")
    starts = np.concatenate([[0], np.cumsum(sizes)])
    chosen = usable[:num_partitions]
    return [order[starts[g]:starts[g + 1]] for g in chosen], [str(names[g]) for g in chosen]


def domain_of_client(client: int, num_domains: int, paired: bool = False) -> int:
    """The domain client ``client`` takes, in turn (twins ``2k``, ``2k + 1`` take the same one)."""
    return (client // 2 if paired else client) % num_domains


def domain_partition(domains: np.ndarray, labels: np.ndarray, num_partitions: int, scheme: str, *, seed: int = 0,
                     paired: bool = False, **options: Any) -> tuple[list[np.ndarray], list[str]]:
    """Clients take the domains in turn (``domain_of_client``), and each domain's samples are partitioned over
    its clients by ``scheme`` (``partition_indices``); each client's sample indices and its domain's name
    (domains in the order they first appear). ``scheme = "natural"``: one client per domain (``TooFewClients``
    when there are fewer domains than clients)."""
    names = list(dict.fromkeys(str(d) for d in domains))
    if scheme == "natural":
        if num_partitions > len(names):
            raise TooFewClients(len(names), f"domains ({', '.join(names)})", num_partitions)
        return [np.flatnonzero(domains == name) for name in names[:num_partitions]], names[:num_partitions]
    parts: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * num_partitions
    for d, name in enumerate(names):
        clients = [i for i in range(num_partitions) if domain_of_client(i, len(names), paired) == d]
        if not clients:
            continue
        rows = np.flatnonzero(domains == name)
        for client, idx in zip(clients, partition_indices(labels[rows], len(clients), scheme, seed=seed + d, paired=paired, **options)):
            parts[client] = rows[idx]
    return parts, [names[domain_of_client(i, len(names), paired)] for i in range(num_partitions)]
