"""What a client and the server need from an ``ExperimentConfig``: data, model, solver settings."""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from .config import DATA_FIELDS, ExperimentConfig
from .data import ClientData, generate_synthetic, train_test_split
from .data.hub import load_hub_partition
from .data.images import IMAGE_SHAPES, load_image_pool, num_classes, to_float
from .data.partition import keep_train_samples, paired_groups, partition_indices, twin_share
from .data.synthetic import DIM, NUM_CLASSES
from .layout import flatten_module, load_flat_
from .methods.apfl import ALPHA_INIT, ALPHA_LR, apfl_local_sgd
from .methods.base import PROXIMAL_MU
from .methods.ditto import ditto_personal_step
from .methods.fedattn import BIAS_REG, GLOBAL_BIASES, fedattn_local_sgd
from .methods.igfl import GLOBAL_DELTA, PARTICIPANTS, igfl_local_sgd
from .methods.per_fedavg import per_fedavg_local_sgd
from .methods.pfedme import INNER_STEPS, LAMBDA as PFEDME_LAMBDA, PERSONAL_LR, personalized_vector, pfedme_local_sgd
from .methods.scaffold import CONTROL, scaffold_local_sgd
from .models import build_model
from .solvers import LocalResult, local_sgd, trainable
from .wire import decode_vector

#: Solver settings the server sends with every training instruction.
LR, LOCAL_STEPS, BATCH_SIZE, SERVER_ROUND = "lr", "local-steps", "batch-size", "server-round"


def solver_config(cfg: ExperimentConfig) -> dict[str, float | int]:
    """The local-solver part of the run config, as sent to clients."""
    return {LR: cfg.lr, LOCAL_STEPS: cfg.local_steps, BATCH_SIZE: cfg.batch_size}


def _pooled(users: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    return np.concatenate([x for x, _ in users]), np.concatenate([y for _, y in users])


@lru_cache(maxsize=4)
def _client_splits(data: ExperimentConfig, num_partitions: int) -> tuple[ClientData, ...]:
    """Every client's train/test data for the data fields of ``data`` (see ``data_config``)."""
    synthetic = data.dataset == "synthetic"
    users = generate_synthetic(data.synthetic_alpha, data.synthetic_beta, num_users=num_partitions, seed=data.seed) if synthetic else None
    if data.partition == "natural":  # Synthetic's users (the config refuses natural for the image sets here)
        shares = users
    else:
        x, y = _pooled(users) if synthetic else load_image_pool(
            data.dataset, data.data_dir, download=data.download, emnist_split=data.emnist_split)
        parts = partition_indices(y, num_partitions, data.partition, alpha=data.dirichlet_alpha,
                                  classes_per_client=data.classes_per_client,
                                  shards_per_client=data.shards_per_client, seed=data.seed, paired=data.paired_clients)
        scale = (lambda a: a) if synthetic else to_float
        shares = [(scale(x[idx]), y[idx]) for idx in parts]
    split_rng, scarce_rng = np.random.default_rng([data.seed, 1]), np.random.default_rng([data.seed, 2])
    return tuple(_client(x, y, data, split_rng, scarce_rng) for x, y in shares)


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


def data_config(cfg: ExperimentConfig) -> ExperimentConfig:
    """``cfg`` with everything but the data fields at their defaults (the cache key of the data)."""
    return replace(ExperimentConfig(), **{name: getattr(cfg, name) for name in DATA_FIELDS})


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


def resolve_device(name: str) -> torch.device:
    """``auto`` is the GPU when one is visible, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def client_generator(seed: int, partition_id: int, server_round: int) -> torch.Generator:
    """Minibatch generator of one client in one round, reproducible from the run seed."""
    state = np.random.SeedSequence([seed, partition_id, server_round]).generate_state(1)[0]
    return torch.Generator().manual_seed(int(state))


def train_client(
    model: nn.Module, data: ClientData, config: Mapping[str, Any], seed: int, partition_id: int,
    anchor: Sequence[torch.Tensor] | None = None,
) -> LocalResult:
    """Run the local solver the server asked for (``config``) on the client's training split.

    ``proximal-mu`` (or legacy FedProx's ``proximal_mu``) is the proximal weight
    toward ``anchor`` (default: the received model); absent means plain local SGD.
    """
    mu = float(config.get(PROXIMAL_MU, config.get("proximal_mu", 0.0)))
    device = next(model.parameters()).device
    return local_sgd(model, data.x_train.to(device), data.y_train.to(device), prox_mu=mu, anchor=anchor,
                     **_solver_args(config, seed, partition_id))


def _solver_args(config: Mapping[str, Any], seed: int, partition_id: int) -> dict[str, Any]:
    """Steps, learning rate, batch size and minibatch generator from a training config."""
    missing = [k for k in (LR, LOCAL_STEPS, BATCH_SIZE) if k not in config]
    if missing:
        raise ValueError(f"training config lacks {missing}: the server must send {LR}, {LOCAL_STEPS} and {BATCH_SIZE}")
    return {"steps": int(config[LOCAL_STEPS]), "lr": float(config[LR]), "batch_size": int(config[BATCH_SIZE]),
            "generator": client_generator(seed, partition_id, int(config.get(SERVER_ROUND, 0)))}


def train_igfl_client(
    model: nn.Module, data: ClientData, config: Mapping[str, Any], seed: int, partition_id: int,
    previous_delta: Sequence[torch.Tensor] | None,
) -> tuple[LocalResult, list[torch.Tensor]]:
    """IGFL-C on the client's training split (Algorithm 2): ``config`` carries the solver settings,
    ``igfl-participants`` and ``igfl-global-delta``; ``previous_delta`` is the client's own last delta
    (``None`` on its first participation). Returns the result and the new delta ``w^{r,T} - w_ps^r``."""
    params = trainable(model)
    received = [p.detach().clone() for p in params]
    device = params[0].device
    result = igfl_local_sgd(
        model, data.x_train.to(device), data.y_train.to(device),
        previous_delta=previous_delta, global_delta=decode_vector(config[GLOBAL_DELTA], received),
        num_participants=int(config[PARTICIPANTS]), **_solver_args(config, seed, partition_id),
    )
    return result, [p.detach() - r for p, r in zip(params, received)]


def train_scaffold_client(
    model: nn.Module, data: ClientData, config: Mapping[str, Any], seed: int, partition_id: int,
    local_control: Sequence[torch.Tensor] | None,
) -> tuple[LocalResult, list[torch.Tensor], torch.Tensor]:
    """SCAFFOLD's client step (option II) on the training split: ``config`` carries the solver
    settings and ``scaffold-control`` (the server's ``c``); ``local_control`` is the client's ``c_i``
    (``None``: zero, before its first participation). Returns the result, the new ``c_i`` and
    ``Δc_i`` as one flat vector."""
    params = trainable(model)
    device = params[0].device
    c_global = [t.to(device) for t in decode_vector(config[CONTROL], params)]
    c_local = [torch.zeros_like(p) for p in params] if local_control is None else [t.to(device) for t in local_control]
    result, new_local, delta = scaffold_local_sgd(model, data.x_train.to(device), data.y_train.to(device),
                                                  c_global=c_global, c_local=c_local, **_solver_args(config, seed, partition_id))
    return result, new_local, torch.cat([d.flatten() for d in delta])


def train_fedattn_client(
    model: nn.Module, data: ClientData, config: Mapping[str, Any], seed: int, partition_id: int,
) -> tuple[LocalResult, torch.Tensor, torch.Tensor]:
    """FedAttn's local solver on the training split (Algorithm 1, localSolver): ``config`` carries
    the solver settings and, for the stabiliser, ``fedattn-bias-reg`` and ``fedattn-global-biases``.
    Returns the result, ``Z_i`` and the gradient with respect to the received biases."""
    device = next(model.parameters()).device
    reg = float(config.get(BIAS_REG, 0.0))
    global_biases = None
    if reg > 0:
        biases = [p for n, p in model.named_parameters() if n.endswith("bias")]
        global_biases = [t.to(device) for t in decode_vector(config[GLOBAL_BIASES], biases)]
    return fedattn_local_sgd(model, data.x_train.to(device), data.y_train.to(device), bias_reg=reg,
                             global_biases=global_biases, **_solver_args(config, seed, partition_id))


def train_ditto_client(
    model: nn.Module, data: ClientData, config: Mapping[str, Any], seed: int, partition_id: int, lam: float,
    personal: torch.Tensor | None,
) -> tuple[LocalResult, torch.Tensor]:
    """Ditto's round on the training split: the personal model (flat ``personal``, ``None`` before
    the first round: the received model) takes proximal steps toward the received global model, then
    ``model`` (reset to the received model) takes plain local SGD steps. Returns the global step's
    result (``model`` holds its update) and the new personal model."""
    device = next(model.parameters()).device
    received = [p.detach().clone() for p in trainable(model)]
    start = flatten_module(model)
    x, y = data.x_train.to(device), data.y_train.to(device)
    args = _solver_args(config, seed, partition_id)
    _, new_personal = ditto_personal_step(model, personal, received, x, y, lam=lam, **args)
    load_flat_(model, start.to(device))
    return local_sgd(model, x, y, **_solver_args(config, seed, partition_id)), new_personal  # fresh minibatch stream


def train_per_fedavg_client(
    model: nn.Module, data: ClientData, config: Mapping[str, Any], seed: int, partition_id: int, alpha: float,
) -> LocalResult:
    """Per-FedAvg's first-order MAML steps on the training split (``lr`` is the outer step β)."""
    device = next(model.parameters()).device
    args = _solver_args(config, seed, partition_id)
    return per_fedavg_local_sgd(model, data.x_train.to(device), data.y_train.to(device), steps=args["steps"], alpha=alpha,
                                beta=args["lr"], batch_size=args["batch_size"], generator=args["generator"])


def train_pfedme_client(
    model: nn.Module, data: ClientData, config: Mapping[str, Any], seed: int, partition_id: int,
) -> tuple[LocalResult, torch.Tensor]:
    """pFedMe's client update on the training split (``config`` carries ``pfedme-lambda``,
    ``pfedme-personal-lr`` and ``pfedme-inner-steps``). Returns the result and θ_i as a flat vector."""
    device = next(model.parameters()).device
    result, theta = pfedme_local_sgd(model, data.x_train.to(device), data.y_train.to(device), lam=float(config[PFEDME_LAMBDA]),
                                     personal_lr=float(config[PERSONAL_LR]), inner_steps=int(config[INNER_STEPS]),
                                     **_solver_args(config, seed, partition_id))
    return result, personalized_vector(model, theta)


def train_apfl_client(
    model: nn.Module, personal: nn.Module, data: ClientData, config: Mapping[str, Any], seed: int, partition_id: int,
    alpha: float | None,
) -> tuple[LocalResult, float]:
    """APFL's local steps on the training split: ``model`` is the global model (its update is the
    reply), ``personal`` the client's own; ``alpha`` ``None`` starts from ``apfl-alpha-init``.
    Returns the result and the new α."""
    device = next(model.parameters()).device
    args = _solver_args(config, seed, partition_id)
    return apfl_local_sgd(model, personal, float(config[ALPHA_INIT]) if alpha is None else alpha, data.x_train.to(device),
                          data.y_train.to(device), alpha_lr=float(config[ALPHA_LR]), **args)
