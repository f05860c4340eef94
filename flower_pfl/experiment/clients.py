"""Every client's data: a data set's pool partitioned over the clients, each share split into its own train,
validation and test parts, made scarce, and encoded for the model.

The data set (``flower_pfl.experiment.datasets``) gives its samples raw; ``partition = "natural"`` gives
each client one natural group (writer, speaking role, subject) or, for a data set of domains, one
domain; a label scheme partitions the whole pool, or each domain's samples over the clients that take it.
Each client's share is split (a seeded shuffle; in time for a data set that asks it, with a natural
partition), ``val-fraction`` of its samples taken out of its training part for validation (its test part
stays as it was), its training part cut to ``train-samples-per-client``, and the data set's encoder, fitted
on every client's training part, turns the raw samples into tensors.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from flower_pfl.engine.last_call import LastCall
from flower_pfl.experiment.config import ConfigError, ExperimentConfig
from flower_pfl.experiment.data import ClientData
from flower_pfl.experiment.data.client_data import smallest_share, split_indices, validation_indices
from flower_pfl.experiment.data.files import MalformedFile, MissingFiles
from flower_pfl.experiment.data.images import headers_only
from flower_pfl.experiment.data.imports import is_import_path
from flower_pfl.experiment.data.info import DataInfo
from flower_pfl.experiment.data.partition import TooFewClients, domain_partition, keep_train_samples, natural_partition, partition_indices
from flower_pfl.experiment.datasets import registry
from flower_pfl.experiment.datasets.base import FILES, DataSet, Pool, Where
from flower_pfl.experiment.datasets.own import OwnData

#: what a node tells the server of its data at the start of a run: the natural group or domain its data
#: come from (``ClientData.group``), written in the run's summary
CLIENT_GROUP = "client-group"


@dataclass(frozen=True)
class DataRequest:
    """What decides every client's data: the data set and its keys' values, where its files are, the
    partition, the split, data scarcity and the data's seed (the cache key of the clients' data)."""

    dataset: str
    options: tuple[tuple[str, Any], ...]
    where: Where
    partition: str
    scheme_options: tuple[tuple[str, Any], ...]
    paired: bool
    train_fraction: float
    train_samples: int
    seed: int
    min_test: int = 0
    val_fraction: float = 0.0

    def data_set(self) -> DataSet:
        return OwnData(self.dataset) if is_import_path(self.dataset) else registry.instance(self.dataset, dict(self.options))


def data_set(cfg: ExperimentConfig) -> DataSet:
    """The configured data set, with its keys' values."""
    return data_request(cfg).data_set()


def data_request(cfg: ExperimentConfig) -> DataRequest:
    """What decides every client's data under ``cfg`` (the request last made is kept for the config it was made
    for: a node's clients, one after another, ask with one config)."""
    return _last_request(cfg)


def _data_request(cfg: ExperimentConfig) -> DataRequest:
    own_keys = () if is_import_path(cfg.dataset) else registry.keys_of(cfg.dataset)
    options = tuple((key, cfg.options[key]) for key in own_keys)
    where = Where(cfg.data_source, cfg.data_dir, cfg.download, cfg.hub_dataset)
    schemes = (("alpha", cfg.dirichlet_alpha), ("classes_per_client", cfg.classes_per_client), ("shards_per_client", cfg.shards_per_client))
    return DataRequest(cfg.dataset, options, where, cfg.partition, schemes, cfg.paired_clients, cfg.train_fraction,
                       cfg.train_samples_per_client, cfg.data_rng_seed, cfg.min_test_samples, cfg.val_fraction)


_last_request = LastCall(_data_request)


def data_info(cfg: ExperimentConfig) -> DataInfo:
    """One sample's shape and kind and the classes of the configured data (a data set of the researcher's own
    is loaded for it); ``vocab-size`` overrides the token ids' range."""
    try:
        info = data_set(cfg).info()
    except ValueError as err:  # a data set of one's own that cannot be loaded
        raise ConfigError(str(err)) from err
    if cfg.vocab_size and info.kind == "tokens":
        if cfg.vocab_size < info.vocab_size:
            raise ConfigError(f"run config 'vocab-size' = {cfg.vocab_size} is invalid: the data's token ids reach "
                              f"{info.vocab_size - 1} (0 takes the size from the data)")
        info = DataInfo(info.input_shape, info.num_classes, info.kind, cfg.vocab_size, info.padding_id)
    return info


def load_client_data(cfg: ExperimentConfig, partition_id: int, num_partitions: int) -> ClientData:
    """Client ``partition_id``'s own train/test data (every client's is built once per process and cached)."""
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition-id {partition_id} is outside [0, {num_partitions})")
    with clients_named(cfg):
        return client_datasets(data_request(cfg), num_partitions)[partition_id]


@contextmanager
def clients_named(cfg: ExperimentConfig) -> Iterator[None]:
    """``TooFewClients`` as a ``ConfigError`` naming where the number of clients came from: ``num-clients`` where it
    is set, else the number of nodes (one client per node)."""
    try:
        yield
    except TooFewClients as err:
        asked = (f"run config 'num-clients' = {cfg.num_clients}" if cfg.num_clients else
                 "one client per node (run config 'num-clients' = 0): the number of nodes, num-supernodes in a simulation "
                 "or the node config's num-partitions in a deployment")
        raise ConfigError(f"run config 'partition' = 'natural' with dataset {cfg.dataset!r}: {err} by {asked}; at most "
                          f"{err.available} clients take one each (a label partition spreads more clients over the data)") from err


@lru_cache(maxsize=4)
def client_datasets(request: DataRequest, num_partitions: int) -> tuple[ClientData, ...]:
    """Every client's data for ``request``."""
    dataset = request.data_set()
    pool = _pool(dataset, request, num_partitions)
    shares = client_shares(dataset, pool, request, num_partitions)
    scarce_rng = np.random.default_rng([request.seed, 2])
    raw = []
    for share in shares:
        x_train, y_train = pool.x[share.train], pool.y[share.train]
        if request.train_samples:
            x_train, y_train = keep_train_samples(x_train, y_train, request.train_samples, scarce_rng)
        raw.append((x_train, y_train))
    encode = dataset.encoder([x for x, _ in raw])
    as_y = lambda y: torch.as_tensor(y, dtype=torch.int64)
    return tuple(ClientData(encode(xt), as_y(yt), encode(pool.x[s.test]), as_y(pool.y[s.test]), s.group,
                            *((encode(pool.x[s.val]), as_y(pool.y[s.val])) if len(s.val) else ()))
                 for (xt, yt), s in zip(raw, shares))


@dataclass(frozen=True)
class Share:
    """A client's samples (indices into the pool): its training, test and validation parts, and the natural group
    or domain they come from."""

    train: np.ndarray
    test: np.ndarray
    val: np.ndarray
    group: str


def client_shares(dataset: DataSet, pool: Pool, request: DataRequest, num_partitions: int) -> list[Share]:
    """Each client's training, test and validation samples and the natural group or domain they come from: the
    pool partitioned, each share split (a seeded shuffle; in time for a data set that asks it, with a natural
    partition; the publisher's split where the pool has one), and ``val_fraction`` of the share taken out of the
    training part (``validation_indices``: a draw of its own, so the test parts and the other clients' parts do
    not move)."""
    parts, groups = _partition(dataset, pool, request, num_partitions)
    split_rng, val_rng = np.random.default_rng([request.seed, 1]), np.random.default_rng([request.seed, 4])
    temporal = dataset.temporal_split and request.partition == "natural"
    published = pool.test is not None and request.partition == "natural"  # the publisher's split of each natural client
    shares: list[Share] = []
    for idx, group in zip(parts, groups):
        if published:
            tr, te = np.flatnonzero(~pool.test[idx]), np.flatnonzero(pool.test[idx])  # type: ignore[index]
            if not len(tr) or not len(te):
                raise ConfigError(f"run config 'dataset' = {request.dataset!r}: the files' own split gives {group!r} "
                                  f"{len(tr)} training and {len(te)} test samples; each needs some")
        else:
            tr, te = split_indices(len(idx), request.train_fraction, split_rng, temporal, dataset.split_gap if temporal else 0,
                                   min_test=request.min_test if request.partition == "natural" else 0)
        try:
            tr, va = validation_indices(tr, len(idx), request.val_fraction, val_rng, temporal, dataset.split_gap if temporal else 0)
        except ValueError as err:
            raise ConfigError(f"run config 'val-fraction' = {request.val_fraction!r}: client {len(shares)} "
                              f"({group or 'of the partition'}) has {len(idx)} samples: {err}") from err
        shares.append(Share(idx[tr], idx[te], idx[va], group))
    return shares


def _pool(dataset: DataSet, request: DataRequest, num_partitions: int) -> Pool:
    """The data set's samples, or a ``ConfigError`` naming the run-config keys when its files are missing."""
    where = request.where
    try:
        return dataset.pool(where, num_partitions, request.seed)
    except FileNotFoundError as err:
        if where.source != FILES or not dataset.has_files:
            raise ConfigError(f"run config 'dataset' = {request.dataset!r}: {err}; set 'hub-dataset' to a folder holding "
                              "the hub's files, or run where the hub can be reached") from err
        raise ConfigError(missing_files_message(dataset, request.dataset, Path(where.data_dir), where.download, err)) from err
    except MalformedFile as err:
        raise ConfigError(f"run config 'dataset' = {request.dataset!r}: a file under data-dir cannot be read: {err}") from err
    except ValueError as err:  # a data set of one's own that is not what the package takes
        raise ConfigError(str(err)) from err


def missing_data(cfg: ExperimentConfig) -> str | None:
    """What a run of ``cfg`` would stop on because its data files are not under ``data-dir`` (looked for, not
    loaded: a file's ``.gz`` counts, a pattern needs one match); ``None`` when they are there, or when the data
    come from the hub, a download, a generator or a function."""
    dataset = data_set(cfg)
    where = data_request(cfg).where
    if where.source != FILES or not dataset.has_files or where.download or is_import_path(cfg.dataset):
        return None
    root = Path(where.data_dir)
    found, missing = dataset.locate(root)
    if not missing:
        return None
    return missing_files_message(dataset, cfg.dataset, root, where.download, MissingFiles(root, found, missing))


def natural_partition_problem(cfg: ExperimentConfig, num_clients: int) -> str | None:
    """What a run of ``cfg`` over ``num_clients`` clients would stop on when it gives each client one natural client
    (fewer drawers, writers, subjects or domains in the files than clients, an image a list names missing, the
    files' own split leaving a client no test samples): the run's own reading and partitioning of the data, each
    image's header read but no pixels decoded (``headers_only``). ``None`` when nothing stops it, for a label
    partition (its clients are drawn from any data), and where the data come from the hub or a download (not
    fetched here)."""
    request = data_request(cfg)
    dataset, where = request.data_set(), request.where
    hub = any(" (" in name for name in dataset.expected_files())  # a part read from the hub's files (digits' MNIST-M)
    if request.partition != "natural" or where.source != FILES or where.download or hub:
        return None
    try:
        with clients_named(cfg), headers_only():
            client_shares(dataset, _pool(dataset, request, num_clients), request, num_clients)
    except ConfigError as err:
        return str(err)
    return None


def missing_files_message(dataset: DataSet, name: str, data_dir: Path, download: bool, err: FileNotFoundError) -> str:
    """What a run whose data files are missing says: which files were found and which are missing (or what
    was looked for), and what to do: ``download = true`` only where it fetches the files (``DataSet.has_download``)."""
    where = f"data-dir {str(data_dir.resolve())!r}"
    if isinstance(err, MissingFiles):
        what = f"{'files missing under' if err.found else 'no files under'} {where}: {err.detail}"
    else:
        what = f"no files under {where} ({', '.join(dataset.expected_files())}): {err}"
    if not dataset.has_download():
        fix = (f"{name!r} has no download: its files are {dataset.files_text}; unpack them under data-dir, or set "
               "'data-dir' to where they are")
    elif download:
        fix = "the download failed; put the files there or check the internet access"
    else:
        fix = "set 'data-dir' or 'download = true'"
    return f"run config 'dataset' = {name!r}: {what}; {fix}"


def _partition(dataset: DataSet, pool: Pool, request: DataRequest, num_partitions: int) -> tuple[list[np.ndarray], list[str]]:
    """Each client's sample indices into the pool, and the natural group or domain each client's data come from."""
    options = dict(request.scheme_options)
    if pool.domains is not None:
        return domain_partition(pool.domains, pool.y, num_partitions, request.partition, seed=request.seed,
                                paired=request.paired, **options)
    if request.partition == "natural":
        if pool.groups is None:
            raise ConfigError(f"run config 'partition' = 'natural' is invalid for dataset {request.dataset!r}: its samples "
                              "name no natural clients (a function of one's own returns them as a third value)")
        gap = dataset.split_gap if dataset.temporal_split else 0  # the publisher's own split (pool.test) decides alone
        return natural_partition(pool.groups, num_partitions,
                                 min_size=2 if pool.test is not None else smallest_share(request.min_test, gap))
    parts = partition_indices(pool.y, num_partitions, request.partition, seed=request.seed, paired=request.paired, **options)
    return parts, [""] * num_partitions
