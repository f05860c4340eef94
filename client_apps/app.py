"""The ClientApp: load this node's partition, run the local solver the server asks for.

It answers Message-API instructions (``arrays`` + ``config`` records, from
``strategies.message`` and Flower's Message-API strategies) and legacy ones
(``fitins.*`` / ``evaluateins.*``, from ``strategies`` and Flower's legacy
strategies), with the same training and evaluation code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.client import Client, NumPyClient
from flwr.client.message_handler.message_handler import handle_legacy_message_from_msgtype
from flwr.clientapp import ClientApp

from flower_pfl.config import ExperimentConfig
from flower_pfl.data import ClientData
from flower_pfl.experiment import load_client_data, make_model, resolve_device, train_client, train_igfl_client
from flower_pfl.methods.base import ANCHOR, ANCHOR_KEEP, ANCHOR_SET
from flower_pfl.methods.igfl import CORRECTION as IGFL_CORRECTION
from flower_pfl.solvers import evaluate as evaluate_model

app = ClientApp()

#: keys in ``context.state``: the remembered proximal anchor, IGFL's last delta
ANCHOR_STATE, IGFL_STATE = "proximal-anchor", "igfl-delta"


@dataclass
class Node:
    """What one node needs for a round: its config, data and a model to load parameters into."""

    cfg: ExperimentConfig
    partition_id: int
    data: ClientData
    model: torch.nn.Module
    state: RecordDict

    @classmethod
    def from_context(cls, context: Context) -> Node:
        cfg = ExperimentConfig.from_mapping(context.run_config)
        pid = int(context.node_config["partition-id"])
        data = load_client_data(cfg, pid, int(context.node_config["num-partitions"]))
        return cls(cfg, pid, data, make_model(cfg).to(resolve_device(cfg.device)), context.state)

    def load(self, arrays: Mapping[str, Any] | list[np.ndarray]) -> None:
        state = self.model.state_dict()
        values = list(arrays.values()) if isinstance(arrays, Mapping) else list(arrays)
        if len(values) != len(state):
            raise ValueError(f"received {len(values)} arrays for a model with {len(state)} tensors")
        with torch.no_grad():
            for target, value in zip(state.values(), values):
                target.copy_(torch.as_tensor(np.asarray(value)))

    def arrays(self) -> list[np.ndarray]:
        return [t.detach().cpu().numpy() for t in self.model.state_dict().values()]

    def _anchor(self, mode: Any) -> list[torch.Tensor] | None:
        """The proximal anchor the server asked for (``None``: the received model).

        ``set``: remember the received model in the node's state; ``keep``: use the one
        remembered last (the received model if there is none yet, e.g. after a restart).
        """
        if mode == ANCHOR_SET:
            self.state[ANCHOR_STATE] = ArrayRecord([p.detach().cpu().numpy() for p in self.model.parameters()])
        elif mode == ANCHOR_KEEP and ANCHOR_STATE in self.state:
            return [torch.as_tensor(a) for a in self.state[ANCHOR_STATE].to_numpy_ndarrays()]
        return None

    def fit(self, config: Mapping[str, Any]) -> dict[str, float]:
        if config.get(IGFL_CORRECTION):
            res = self._fit_igfl(config)
        else:
            anchor = self._anchor(config.get(ANCHOR))
            res = train_client(self.model, self.data, config, self.cfg.seed, self.partition_id, anchor=anchor)
        return {"train-loss": res.loss, "num-examples": self.data.num_train}

    def _fit_igfl(self, config: Mapping[str, Any]) -> Any:
        """IGFL-C with this client's last delta from its state (none on its first participation)."""
        stored = self.state.get(IGFL_STATE)
        previous = [torch.as_tensor(a) for a in stored.to_numpy_ndarrays()] if stored is not None else None
        res, delta = train_igfl_client(self.model, self.data, config, self.cfg.seed, self.partition_id, previous)
        self.state[IGFL_STATE] = ArrayRecord([d.cpu().numpy() for d in delta])
        return res

    def evaluate(self) -> dict[str, float]:
        device = next(self.model.parameters()).device
        res = evaluate_model(self.model, self.data.x_test.to(device), self.data.y_test.to(device))
        return {"loss": res.loss, "accuracy": res.accuracy, "num-examples": res.num_examples,
                "partition-id": self.partition_id}


def _is_legacy(msg: Message) -> bool:
    return any(key.startswith(("fitins.", "evaluateins.")) for key in msg.content.keys())


class _LegacyClient(NumPyClient):
    def __init__(self, node: Node) -> None:
        self.node = node

    def fit(self, parameters: list[np.ndarray], config: dict[str, Any]) -> tuple[list[np.ndarray], int, dict[str, Any]]:
        self.node.load(parameters)
        metrics = self.node.fit(config)
        return self.node.arrays(), int(metrics.pop("num-examples")), metrics

    def evaluate(self, parameters: list[np.ndarray], config: dict[str, Any]) -> tuple[float, int, dict[str, Any]]:
        self.node.load(parameters)
        metrics = self.node.evaluate()
        return float(metrics.pop("loss")), int(metrics.pop("num-examples")), metrics


def _legacy(msg: Message, context: Context) -> Message:
    node = Node.from_context(context)

    def client_fn(_: Context) -> Client:
        return _LegacyClient(node).to_client()

    return handle_legacy_message_from_msgtype(client_fn, msg, context)


@app.train()
def train(msg: Message, context: Context) -> Message:
    if _is_legacy(msg):
        return _legacy(msg, context)
    node = Node.from_context(context)
    received = msg.content["arrays"]
    node.load({k: v.numpy() for k, v in received.items()})
    metrics = node.fit(msg.content["config"])
    reply = RecordDict({
        "arrays": ArrayRecord({k: Array(a) for k, a in zip(received.keys(), node.arrays())}),
        "metrics": MetricRecord(metrics),
    })
    return Message(content=reply, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    if _is_legacy(msg):
        return _legacy(msg, context)
    node = Node.from_context(context)
    node.load({k: v.numpy() for k, v in msg.content["arrays"].items()})
    return Message(content=RecordDict({"metrics": MetricRecord(node.evaluate())}), reply_to=msg)


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Tell the server this node's ``partition-id`` (to order nodes reproducibly) and the most
    frequent label of its training data (only to group clients in diagnostic plots)."""
    node = Node.from_context(context)
    dominant = int(torch.bincount(node.data.y_train).argmax()) if node.data.num_train else -1
    return Message(content=RecordDict({"metrics": MetricRecord({"partition-id": node.partition_id, "dominant-label": dominant})}),
                   reply_to=msg)
