"""Build the strategy a run config asks for, for either Flower API."""

from __future__ import annotations

from typing import Any, Callable, Mapping

from logging import WARNING

import numpy as np
from flwr.common import ndarrays_to_parameters
from flwr.common.logger import log
from flwr.server.strategy import Strategy as LegacyStrategy
from flwr.serverapp.strategy import Strategy as MessageStrategy

import strategies
import strategies.message
from flower_pfl.config import ExperimentConfig
from flower_pfl.experiment import resolve_device, solver_config
from strategies.client_personalized_servers import PFedMeServer
from strategies.metrics import personalized_evaluate_metrics, personalized_evaluate_metrics_legacy, weighted_train_metrics


#: the strategy class of each method; ``strategies`` and ``strategies.message`` both export these names
CLASS_NAMES: dict[str, str] = {
    "fedavg": "FedAvg", "fedprox": "FedProx", "fedavgm": "FedAvgM", "fedadam": "FedAdam",
    "igfl": "IGFL", "igfl-c": "IGFL", "igfl-s": "IGFL", "scaffold": "SCAFFOLD", "fedattn": "FedAttn", "ditto": "Ditto", "per-fedavg": "PerFedAvg", "pfedme": "PFedMe", "apfl": "APFL",
    "fedmcsa": "FedMCSA", "fedacs": "FedACS", "local": "Local", "fedamp": "FedAMP", "heurfedamp": "HeurFedAMP",
}
#: methods that train one global model (evaluated on every client's test split)
#: (FedAttn, Ditto and Per-FedAvg build on FedAvg too; their clients evaluate a model personalized from it)
GLOBAL_METHODS = ("fedavg", "fedprox", "fedavgm", "fedadam", "scaffold", "igfl", "igfl-c", "igfl-s", "fedattn", "ditto", "per-fedavg", "pfedme", "apfl")


def _participants(cfg: ExperimentConfig, num_nodes: int) -> int:
    """Clients per round, capped at the nodes connected at start (a simulation never gets more)."""
    if 0 < num_nodes < cfg.clients_per_round:
        log(WARNING, "clients-per-round = %d but only %d nodes are connected: using %d", cfg.clients_per_round, num_nodes, num_nodes)
        return num_nodes
    return cfg.clients_per_round


def _personalized_kwargs(cfg: ExperimentConfig, k: int) -> dict[str, Any]:
    return {"clients_per_round": k, "seed": cfg.seed, "device": resolve_device(cfg.device)}


def _method_kwargs(cfg: ExperimentConfig) -> dict[str, Any]:
    """The method's own constructor arguments from the run config."""
    m = cfg.method
    if m == "fedmcsa":
        return {"sigma": cfg.sigma, "lam": cfg.lam, "grouping": cfg.layer_grouping, "all_clients_train": cfg.all_clients_train}
    if m == "fedacs":
        return {"p": cfg.fedacs_p, "all_clients_train": cfg.all_clients_train}
    if m == "fedamp":
        return {"alpha_k": cfg.fedamp_alpha_k, "sigma": cfg.fedamp_sigma, "lam": cfg.fedamp_lambda,
                "all_clients_train": cfg.all_clients_train}
    if m == "heurfedamp":
        return {"alpha_k": cfg.fedamp_alpha_k, "sigma": cfg.heurfedamp_sigma, "lam": cfg.fedamp_lambda,
                "self_weight": cfg.heurfedamp_self_weight, "all_clients_train": cfg.all_clients_train}
    if m == "local":
        return {"all_clients_train": cfg.all_clients_train}
    if m == "fedprox":
        return {"proximal_mu": cfg.proximal_mu}
    if m == "fedavgm":
        return {"server_learning_rate": 1.0, "server_momentum": cfg.server_momentum}
    if m == "fedadam":
        return {"eta": cfg.fedadam_eta, "eta_l": cfg.lr, "tau": cfg.fedadam_tau}
    if m == "ditto":
        return {"lam": cfg.ditto_lambda}
    if m == "apfl":
        return {"alpha_init": cfg.apfl_alpha_init, "alpha_lr": cfg.apfl_alpha_lr}
    if m == "pfedme":
        return {"beta": cfg.pfedme_beta, "lam": cfg.pfedme_lambda, "personal_lr": cfg.pfedme_personal_lr,
                "inner_steps": cfg.pfedme_inner_steps}
    if m == "per-fedavg":
        return {"alpha": cfg.per_fedavg_alpha}
    if m == "fedattn":
        return {"k": cfg.fedattn_k, "d_k": cfg.fedattn_dk, "attention_lr": cfg.fedattn_lr, "bias_reg": cfg.fedattn_bias_reg,
                "warmup_rounds": cfg.fedattn_warmup, "learn_values": cfg.fedattn_learn_values, "seed": cfg.seed}
    if m in ("igfl", "igfl-c", "igfl-s"):  # IGFL = IGFL-C + IGFL-S; IGFL-C alone averages the deltas
        return {"attention": None if m == "igfl-c" else cfg.igfl_attention, "client_correction": m != "igfl-s"}
    return {}


def _choice(cfg: ExperimentConfig) -> tuple[str, dict[str, Any], bool]:
    """The strategy class name, its method arguments, and whether it trains a global model.

    ``aggregation = "mcsa"`` (FedMCSA's Table 2) keeps the method's client rule and replaces its
    averaging by FedMCSA's layer-wise attention over per-client models: FedAvg+MCSA is FedMCSA
    without the proximal term, pFedMe+MCSA sends pFedMe's client settings instead.
    ``aggregation = "mean"`` on FedMCSA (its FedMCSA^-MCSA) averages instead: FedProx with μ = λ.
    """
    if cfg.aggregation == "mean":  # FedMCSA^-MCSA: its proximal client toward the plain average, i.e. FedProx
        return "FedProx", {"proximal_mu": cfg.lam}, True
    if cfg.aggregation == "mcsa":
        mcsa = {"sigma": cfg.sigma, "grouping": cfg.layer_grouping, "all_clients_train": cfg.all_clients_train}
        if cfg.method == "pfedme":
            pfedme = PFedMeServer(**_method_kwargs(cfg))
            return "FedMCSA", {**mcsa, "client_settings": pfedme.instructions(0),
                               "evaluation_settings": pfedme.evaluation_config()}, False
        return "FedMCSA", {**mcsa, "lam": 0.0}, False
    return CLASS_NAMES[cfg.method], _method_kwargs(cfg), cfg.method in GLOBAL_METHODS


def build_message_strategy(cfg: ExperimentConfig, num_nodes: int, ranks: Mapping[int, int] | None = None) -> MessageStrategy:
    """Message-API strategy; ``num_nodes`` turns ``clients-per-round`` into Flower's fractions,
    ``ranks`` (node id -> partition id) orders our strategies' sampling."""
    k = _participants(cfg, num_nodes)
    name, kwargs, global_model = _choice(cfg)
    cls = getattr(strategies.message, name)
    if global_model:
        return cls(fraction_train=min(1.0, k / max(num_nodes, 1)), min_train_nodes=k, min_available_nodes=k,
                   fraction_evaluate=1.0, evaluate_metrics_aggr_fn=personalized_evaluate_metrics, **kwargs)
    strategy = cls(min_available_nodes=k, **_personalized_kwargs(cfg, k), **kwargs)
    strategy.server.node_rank = dict(ranks or {})
    return strategy


def build_legacy_strategy(
    cfg: ExperimentConfig, initial: list[np.ndarray], num_nodes: int, ranks: Mapping[int, int] | None = None
) -> LegacyStrategy:
    """Legacy-API strategy (``configure_fit`` / ``aggregate_fit``)."""
    k = _participants(cfg, num_nodes)
    params = ndarrays_to_parameters(initial)
    fit_config: Callable[[int], dict[str, Any]] = lambda _round: dict(solver_config(cfg))  # noqa: E731
    name, kwargs, global_model = _choice(cfg)
    cls = getattr(strategies, name)
    if global_model:
        return cls(fraction_fit=min(1.0, k / max(num_nodes, 1)), min_fit_clients=k, min_available_clients=k,
                   fraction_evaluate=1.0, initial_parameters=params, on_fit_config_fn=fit_config,
                   fit_metrics_aggregation_fn=weighted_train_metrics,
                   evaluate_metrics_aggregation_fn=personalized_evaluate_metrics_legacy, **kwargs)
    strategy = cls(initial_parameters=params, min_available_clients=k, on_fit_config_fn=fit_config,
                   **_personalized_kwargs(cfg, k), **kwargs)
    strategy.server.node_rank = {str(n): r for n, r in (ranks or {}).items()}  # legacy client ids are strings
    return strategy
