"""Build the strategy a run config asks for, for either Flower API, from the method registry."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from logging import WARNING
from typing import Any

import numpy as np
from flwr.common import ndarrays_to_parameters
from flwr.common.logger import log
from flwr.server.strategy import Strategy as LegacyStrategy
from flwr.serverapp.strategy import Strategy as MessageStrategy

import strategies
import strategies.message
from flower_pfl.engine.client_algorithm import SERVER_ROUND
from flower_pfl.engine.wording import agreeing, counted
from flower_pfl.experiment.build import resolve_device, training_config
from flower_pfl.experiment.config import ExperimentConfig
from strategies.aggregated_metrics import PersonalizedMetrics, weighted_train_metrics


def participants(cfg: ExperimentConfig, num_nodes: int) -> int:
    """Clients per round, capped at the nodes connected at start (a simulation never gets more)."""
    if 0 < num_nodes < cfg.clients_per_round:
        log(WARNING, "clients-per-round = %d but only %s %s connected: using %d", cfg.clients_per_round, counted(num_nodes, "node"),
            agreeing(num_nodes, "is", "are"), num_nodes)
        return num_nodes
    return cfg.clients_per_round


def build_message_strategy(cfg: ExperimentConfig, num_nodes: int, ranks: Mapping[int, int] | None = None,
                           store_dir: str | None = None, unseen: Collection[int] = ()) -> MessageStrategy:
    """Message-API strategy; ``num_nodes`` turns ``clients-per-round`` into Flower's fractions,
    ``ranks`` (node id -> partition id) orders our strategies' sampling; ``unseen``: the partition ids that
    never train (``flower_pfl.experiment.unseen``)."""
    k = participants(cfg, num_nodes - len(unseen))
    cls = getattr(strategies.message, cfg.entry.strategy)
    if cfg.entry.builtin:  # Flower's own FedAvg family
        return cls(fraction_train=min(1.0, k / max(num_nodes, 1)), min_train_nodes=k, min_available_nodes=k,
                   fraction_evaluate=1.0, evaluate_metrics_aggr_fn=PersonalizedMetrics(), **cfg.method_arguments())
    strategy = cls(**cfg.method_arguments(), clients_per_round=k, min_available_nodes=k, seed=cfg.seed,
                   device=resolve_device(cfg.device), store_dir=store_dir, node_wait_timeout=cfg.node_wait_timeout,
                   lost_node_rounds=cfg.lost_node_rounds, rank_query=True, unseen_clients=unseen,
                   new_client_finetune_steps=cfg.new_client_finetune_steps, **cfg.bounds())  # our ClientApp answers queries
    strategy.server.node_rank = dict(ranks or {})
    return strategy


def build_legacy_strategy(
    cfg: ExperimentConfig, initial: Mapping[str, np.ndarray], num_nodes: int, ranks: Mapping[int, int] | None = None,
    store_dir: str | None = None, instructions: Mapping[str, Any] | None = None, unseen: Collection[int] = (),
) -> LegacyStrategy:
    """Legacy-API strategy (``configure_fit`` / ``aggregate_fit``); ``initial``: the named starting model;
    ``instructions``: entries for every training and evaluation instruction; ``unseen``: as
    ``build_message_strategy``'s."""
    k = participants(cfg, num_nodes - len(unseen))
    extra = dict(instructions or {})
    fit_config: Callable[[int], dict[str, Any]] = lambda rnd: {**training_config(cfg), **extra, SERVER_ROUND: rnd}
    evaluate_config: Callable[[int], dict[str, Any]] = lambda rnd: dict(extra)
    cls = getattr(strategies, cfg.entry.strategy)
    if cfg.entry.builtin:
        return cls(fraction_fit=min(1.0, k / max(num_nodes, 1)), min_fit_clients=k, min_available_clients=k,
                   fraction_evaluate=1.0, initial_parameters=ndarrays_to_parameters(list(initial.values())),
                   on_fit_config_fn=fit_config, on_evaluate_config_fn=evaluate_config, fit_metrics_aggregation_fn=weighted_train_metrics,
                   evaluate_metrics_aggregation_fn=PersonalizedMetrics().legacy, **cfg.method_arguments())
    strategy = cls(**cfg.method_arguments(), initial_parameters=initial, clients_per_round=k, min_available_clients=k,
                   on_fit_config_fn=fit_config, on_evaluate_config_fn=evaluate_config, seed=cfg.seed,
                   device=resolve_device(cfg.device), store_dir=store_dir, node_wait_timeout=cfg.node_wait_timeout,
                   lost_node_rounds=cfg.lost_node_rounds, unseen_clients=unseen,
                   new_client_finetune_steps=cfg.new_client_finetune_steps, **cfg.bounds())
    strategy.server.node_rank = dict(ranks or {})
    return strategy
