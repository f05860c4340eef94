"""What a client and the server need from an ``ExperimentConfig``: data, model, training settings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from flower_pfl.engine.client_algorithm import BATCH_SIZE, LOCAL_STEPS, LR, SERVER_ROUND
from flower_pfl.experiment.config import DATA_FIELDS, ConfigError, ExperimentConfig
from flower_pfl.experiment.data import ClientData, generate_synthetic, train_test_split
from flower_pfl.experiment.data.hub import load_hub_partition
from flower_pfl.experiment.data.images import IMAGE_SHAPES, expected_files, load_image_pool, num_classes, to_float
from flower_pfl.experiment.data.partition import keep_train_samples, paired_groups, partition_indices, twin_share
from flower_pfl.experiment.data.synthetic import DIM, NUM_CLASSES
from flower_pfl.experiment.models import build_model


def training_config(cfg: ExperimentConfig) -> dict[str, float | int]:
    """The local-training part of the run config, as sent to clients."""
    return {LR: cfg.lr, LOCAL_STEPS: cfg.local_steps, BATCH_SIZE: cfg.batch_size}


def _pooled(users: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    return np.concatenate([x for x, _ in users]), np.concatenate([y for _, y in users])


@lru_cache(maxsize=4)
def _client_splits(data: ExperimentConfig, num_partitions: int) -> tuple[ClientData, ...]:
    """Every client's train/test data for the data fields of ``data`` (see ``data_config``)."""
    synthetic = data.dataset == "synthetic"
    users = generate_synthetic(data.synthetic_alpha, data.synthetic_beta, num_users=num_partitions, seed=data.seed) if synthetic else None
    if data.partition == "natural":  # Synthetic's users (the config refuses natural for the image sets here)
        assert users is not None
        shares = users
    else:
        x, y = _pooled(users) if users is not None else _image_pool(data)
        parts = partition_indices(y, num_partitions, data.partition, alpha=data.dirichlet_alpha,
                                  classes_per_client=data.classes_per_client,
                                  shards_per_client=data.shards_per_client, seed=data.seed, paired=data.paired_clients)
        scale = (lambda a: a) if synthetic else to_float
        shares = [(scale(x[idx]), y[idx]) for idx in parts]
    split_rng, scarce_rng = np.random.default_rng([data.seed, 1]), np.random.default_rng([data.seed, 2])
    return tuple(_client(x, y, data, split_rng, scarce_rng) for x, y in shares)


def _image_pool(data: ExperimentConfig) -> tuple[np.ndarray, np.ndarray]:
    """The pooled image data set, or a ``ConfigError`` naming the run-config keys when its files are missing."""
    try:
        return load_image_pool(data.dataset, data.data_dir, download=data.download, emnist_split=data.emnist_split)
    except FileNotFoundError as err:
        fix = ("the download failed; put the files there or check the internet access" if data.download
               else "set 'data-dir' or 'download = true'")
        raise ConfigError(f"run config 'dataset' = {data.dataset!r}: no files under data-dir {str(Path(data.data_dir).resolve())!r} "
                          f"({', '.join(expected_files(data.dataset, data.emnist_split))}); {fix}") from err


def _client(x: np.ndarray, y: np.ndarray, data: ExperimentConfig,
            split_rng: np.random.Generator, scarce_rng: np.random.Generator) -> ClientData:
    """One client's own train/test split, then data scarcity (training part only)."""
    client = train_test_split(x, y, data.train_fraction, split_rng)
    if data.train_samples_per_client:
        xs, ys = keep_train_samples(client.x_train.numpy(), client.y_train.numpy(), data.train_samples_per_client, scarce_rng)
        client = ClientData(torch.as_tensor(xs), torch.as_tensor(ys), client.x_test, client.y_test)
    return client


@lru_cache(maxsize=64)
def _hub_client(data: ExperimentConfig, num_partitions: int, partition_id: int) -> ClientData:
    """A client of a ``FederatedDataset``: only its own partition is loaded."""
    options = {"alpha": data.dirichlet_alpha, "classes_per_client": data.classes_per_client,
               "shards_per_client": data.shards_per_client}
    paired = data.paired_clients  # twins 2k, 2k+1 split the scheme's k-th partition
    pid, n = (partition_id // 2, paired_groups(num_partitions)) if paired else (partition_id, num_partitions)
    x, y = load_hub_partition(data.dataset, data.hub_dataset, data.partition, pid, n, options, data.seed)
    if paired:
        keep = twin_share(len(y), partition_id, num_partitions, data.seed)
        x, y = x[keep], y[keep]
    rngs = np.random.default_rng([data.seed, 1, partition_id]), np.random.default_rng([data.seed, 2, partition_id])
    return _client(to_float(x), y, data, *rngs)


@lru_cache(maxsize=8)
def data_config(cfg: ExperimentConfig) -> ExperimentConfig:
    """``cfg`` with everything but the data fields at their defaults (the cache key of the data); its ``seed``
    is the data's (``ExperimentConfig.data_rng_seed``)."""
    return replace(ExperimentConfig(), **{name: getattr(cfg, name) for name in DATA_FIELDS}, seed=cfg.data_rng_seed)


def load_client_data(cfg: ExperimentConfig, partition_id: int, num_partitions: int) -> ClientData:
    """Client ``partition_id``'s own train/test data (built once per process and cached)."""
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition-id {partition_id} is outside [0, {num_partitions})")
    if cfg.data_source == "flwr-datasets" and cfg.dataset != "synthetic":
        return _hub_client(data_config(cfg), num_partitions, partition_id)
    return _client_splits(data_config(cfg), num_partitions)[partition_id]


def dataset_shape(cfg: ExperimentConfig) -> tuple[tuple[int, ...], int]:
    """``(input_shape, num_classes)`` of the configured data set (one sample's shape)."""
    if cfg.dataset == "synthetic":
        return (DIM,), NUM_CLASSES
    return IMAGE_SHAPES[cfg.dataset], num_classes(cfg.dataset, cfg.emnist_split)


def make_model(cfg: ExperimentConfig, seed: int | None = None) -> nn.Module:
    """The configured model; ``seed`` fixes the initialization (the server's starting model)."""
    input_shape, num_classes = dataset_shape(cfg)
    return build_model(cfg.model, input_shape, num_classes, hidden=cfg.hidden_units, seed=seed)


def initial_arrays(cfg: ExperimentConfig, partition_id: int | None = None) -> dict[str, np.ndarray]:
    """A starting model as named arrays, as ``cfg.init`` says: ``zero``: every parameter 0; ``shared``
    (or ``partition_id`` None): the PyTorch-default model seeded by ``cfg.seed``; ``independent``: the
    PyTorch-default model seeded by ``(cfg.seed, partition_id)``, leaving torch's global random state
    as it was (the others seed it, as ``make_model`` does). Both scaled by ``cfg.init_scale``."""
    if cfg.init == "independent" and partition_id is not None:
        with torch.random.fork_rng(devices=[]):
            model = make_model(cfg, seed=int(np.random.SeedSequence([cfg.seed, partition_id]).generate_state(1)[0]))
    else:
        model = make_model(cfg, seed=cfg.seed)
    scale = 0.0 if cfg.init == "zero" else cfg.init_scale
    return {name: (scale * t.detach().cpu()).numpy() for name, t in model.state_dict().items()}


def has_hidden_layers(arrays: Mapping[str, np.ndarray]) -> bool:
    """More than one weight matrix or kernel: zero starting weights then leave hidden units identical."""
    return sum(np.ndim(a) >= 2 for a in arrays.values()) > 1


def resolve_device(name: str) -> torch.device:
    """``auto`` is the GPU when one is visible, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def check_device(name: str) -> None:
    """Raise ``ConfigError`` when device ``name`` (``auto``, ``cpu``, ``cuda``, ``cuda:<i>``, ``mps``)
    is not available on this machine, so that a run fails before it writes anything."""
    if name in ("auto", "cpu"):
        return
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise ConfigError(f"run config 'device' = {name!r}: not a device name ({err}); use 'auto' or 'cpu'") from err
    problem = None
    if device.type == "cuda" and not torch.cuda.is_available():
        problem = "no CUDA device is visible (torch.cuda.is_available() is False)"
    elif device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        problem = f"only {torch.cuda.device_count()} CUDA device(s) are visible (torch.cuda.device_count())"
    elif device.type == "mps" and not torch.backends.mps.is_available():
        problem = "no MPS device is available (torch.backends.mps.is_available() is False)"
    if problem:
        raise ConfigError(f"run config 'device' = {name!r}: {problem}; use 'auto' or 'cpu'")


def client_generator(seed: int, partition_id: int, server_round: int) -> torch.Generator:
    """Minibatch generator of one client in one round, reproducible from the run seed."""
    state = np.random.SeedSequence([seed, partition_id, server_round]).generate_state(1)[0]
    return torch.Generator().manual_seed(int(state))


def training_settings(config: Mapping[str, Any], seed: int, partition_id: int) -> dict[str, Any]:
    """Steps, learning rate, batch size and minibatch generator from a training config."""
    missing = [k for k in (LR, LOCAL_STEPS, BATCH_SIZE) if k not in config]
    if missing:
        raise ValueError(f"training config lacks {missing}: the server must send {LR}, {LOCAL_STEPS} and {BATCH_SIZE}")
    return {"steps": int(config[LOCAL_STEPS]), "lr": float(config[LR]), "batch_size": int(config[BATCH_SIZE]),
            "generator": client_generator(seed, partition_id, int(config.get(SERVER_ROUND, 0)))}
