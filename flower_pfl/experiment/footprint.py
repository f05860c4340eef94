"""What a run's layout takes in memory, estimated before its first round (``Footprint``), and a run that
cannot fit refused with the estimate and the fix (``check_fits``).

The parts, in bytes (``flower_pfl.engine.memory`` says what one client's training counts):

- the server's store: what the method keeps per client (the clients' own columns, ``own_columns``), for every
  client, where the store is in memory (``store = "disk"`` keeps it in files);
- the server's round: the messages of an evaluation round (what differs between the clients' models, each
  client's; ``flower_pfl.engine.wire.RoundArrays``) and of a training round (the sampled clients' models, sent
  and received);
- a node's round: the models of its sampled clients, sent and received, one computation of them
  (``clients-per-computation``, at least one client's training) and the client state of those clients.

In process, the server and the nodes (one at a time) share the machine; under ``flwr run``'s simulation, the
server and the nodes that run at once (one per CPU core, at most); in a deployment, the server alone (each
node sizes its own computations, ``Node.clients_per_computation``).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from flower_pfl.engine.memory import available_bytes, model_bytes, shown, training_bytes
from flower_pfl.engine.server_algorithm import PersonalizedAlgorithm, ServerAlgorithm
from flower_pfl.experiment.clients import data_info
from flower_pfl.experiment.config import ConfigError, ExperimentConfig

#: where the run's nodes run: in the ServerApp's process, in ``flwr run``'s simulation on this machine, elsewhere
IN_PROCESS, SIMULATION, DEPLOYMENT = "in process", "simulation", "deployment"


@dataclass(frozen=True)
class Footprint:
    """A run's estimated memory by part (see the module), in bytes."""

    store: int
    server_round: int
    node_round: int
    nodes_at_once: int
    #: what the estimate is of, for the message: clients, nodes, clients per node and per round
    clients: int
    nodes: int
    per_node: int
    per_round: int
    one_client: int

    @property
    def total(self) -> int:
        return self.store + self.server_round + self.nodes_at_once * self.node_round


def footprint(cfg: ExperimentConfig, method: ServerAlgorithm | None, model: torch.nn.Module, clients: int, nodes: int,
              where: str) -> Footprint:
    """The memory the run ``cfg`` takes with ``clients`` clients on ``nodes`` nodes, its ``method`` set up on the
    run's model (``None``: Flower's own, one global model), ``model`` the run's architecture, its nodes ``where``."""
    model_size = model_bytes(model)
    per_round = min(cfg.clients_per_round, clients)
    per_node = max(1, math.ceil(clients / max(nodes, 1)))
    sampled_on_node = min(per_node, per_round)
    own = model_size if method is None else 4 * _own_width(method)
    keeps_rows = isinstance(method, PersonalizedAlgorithm)
    store = clients * own if keeps_rows and cfg.store == "memory" else 0
    evaluation = clients * own if keeps_rows else model_size
    server_round = max(evaluation, 3 * per_round * model_size) + 2 * model_size
    algorithm = method.client_algorithm() if method is not None else None
    kept = 0 if algorithm is None else (len(algorithm.batched_state) + len(algorithm.carried)) * model_size
    state = 0 if algorithm is None or not algorithm.keeps_state else model_size
    info = data_info(cfg)
    sample = torch.zeros(info.input_shape, dtype=torch.long if info.kind == "tokens" else torch.float32)
    one_client = training_bytes(model, sample, cfg.batch_size, kept)
    at_once = min(sampled_on_node, cfg.clients_per_computation or sampled_on_node)
    node_round = sampled_on_node * (2 * model_size + state) + at_once * one_client
    if where == DEPLOYMENT:
        nodes_at_once = 0
    elif where == SIMULATION:
        nodes_at_once = min(nodes, os.cpu_count() or 1)
    else:
        nodes_at_once = 1
    return Footprint(store, server_round, node_round, nodes_at_once, clients, nodes, per_node, per_round, one_client)


def check_fits(cfg: ExperimentConfig, method: ServerAlgorithm | None, model: torch.nn.Module, clients: int, nodes: int,
               where: str, free: int | None = None) -> Footprint:
    """``footprint``, refused with ``ConfigError`` when it exceeds ``free`` (default: this machine's available
    memory): the estimate by part and what to change."""
    found = footprint(cfg, method, model, clients, nodes, where)
    free = available_bytes() if free is None else free
    if found.total <= free:
        return found
    parts = [f"the server's store of {found.clients} clients' models: {shown(found.store)}" if found.store else "",
             f"a round's messages on the server: {shown(found.server_round)}",
             (f"a node's round ({found.per_node} clients a node, {min(found.per_node, found.per_round)} of them in a round, "
              f"one client's training about {shown(found.one_client)})"
              + (f", {found.nodes_at_once} nodes at once" if found.nodes_at_once > 1 else "") + f": {shown(found.node_round)}")
             if found.nodes_at_once else ""]
    fixes = ["store = 'disk' (the clients' models in files)" if found.store else "",
             "fewer clients a node (more nodes: num-supernodes)" if found.per_node > 1 and found.nodes_at_once else "",
             "fewer clients-per-round", "a smaller clients-per-computation" if found.nodes_at_once else "",
             "a smaller batch-size or model"]
    raise ConfigError(f"this run would need about {shown(found.total)} of memory {where} and the machine has "
                      f"{shown(free)} free: {'; '.join(p for p in parts if p)}. Try {', '.join(f for f in fixes if f)}")


def _own_width(method: ServerAlgorithm) -> int:
    """The values a method keeps per client (its store's rows), or the model's where it keeps no store."""
    store = getattr(method, "store", None)
    return int(store.dim) if store is not None else method.layout.dim
