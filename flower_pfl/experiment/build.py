"""What a client and the server need from an ``ExperimentConfig``: data (``clients``), model, training settings."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from flower_pfl.engine.client_algorithm import BATCH_SIZE, LOCAL_STEPS, LR, SERVER_ROUND
from flower_pfl.engine.model_facts import ModelFacts
from flower_pfl.experiment.clients import data_info, load_client_data
from flower_pfl.experiment.config import ConfigError, ExperimentConfig
from flower_pfl.experiment.data.imports import is_import_path
from flower_pfl.experiment.models.base import ModelSettings
from flower_pfl.experiment.models.pretrained import load_pretrained
from flower_pfl.experiment.models.registry import build_model

__all__ = ["check_method_applies", "data_info", "dataset_shape", "initial_arrays", "load_client_data", "make_model",
           "training_config"]


def training_config(cfg: ExperimentConfig) -> dict[str, float | int]:
    """The local-training part of the run config, as sent to clients."""
    return {LR: cfg.lr, LOCAL_STEPS: cfg.local_steps, BATCH_SIZE: cfg.batch_size}


def dataset_shape(cfg: ExperimentConfig) -> tuple[tuple[int, ...], int]:
    """``(input_shape, num_classes)`` of the configured data set (one sample's shape)."""
    info = data_info(cfg)
    return info.input_shape, info.num_classes


def make_model(cfg: ExperimentConfig, seed: int | None = None) -> nn.Module:
    """The configured model for the configured data; ``seed`` fixes the initialization (the server's starting
    model). A model that cannot take the data, or a model of one's own that is not what the package takes,
    is a ``ConfigError``."""
    try:
        return build_model(cfg.model, data_info(cfg), cfg.options, ModelSettings(cfg.model_width, cfg.dropout), seed)
    except ValueError as err:
        raise ConfigError(f"run config 'model' = {cfg.model!r}: {err}" if not str(err).startswith("run config") else str(err)) from err


def check_method_applies(cfg: ExperimentConfig) -> None:
    """A ``ConfigError`` when the run's method cannot run on its model (``Method.check_model``), before anything
    runs. A package data set and model were checked when the run config was read; a data set or model of one's
    own is checked here, on the model built from it."""
    if is_import_path(cfg.dataset) or is_import_path(cfg.model):
        cfg.refuse_unless_method_runs_on(ModelFacts.of_model(make_model(cfg)))


def initial_arrays(cfg: ExperimentConfig, partition_id: int | None = None) -> dict[str, np.ndarray]:
    """A starting model as named arrays, as ``cfg.init`` says: ``zero``: every parameter 0; ``shared``
    (or ``partition_id`` None): the PyTorch-default model seeded by ``cfg.seed``; ``independent``: the
    PyTorch-default model seeded by ``(cfg.seed, partition_id)``, leaving torch's global random state
    as it was (the others seed it, as ``make_model`` does). Both take the ``pretrained`` weights where
    set, and are scaled by ``cfg.init_scale``."""
    if cfg.init == "independent" and partition_id is not None:
        with torch.random.fork_rng(devices=[]):
            model = make_model(cfg, seed=int(np.random.SeedSequence([cfg.seed, partition_id]).generate_state(1)[0]))
    else:
        model = make_model(cfg, seed=cfg.seed)
    if cfg.pretrained:
        load_pretrained(model, cfg.pretrained)
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
