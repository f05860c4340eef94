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
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.client import Client, NumPyClient
from flwr.client.message_handler.message_handler import handle_legacy_message_from_msgtype
from flwr.clientapp import ClientApp

from client_apps.rules import (
    ANCHOR_STATE, APFL_STATE, DITTO_STATE, IGFL_STATE, PFEDME_STATE, SCAFFOLD_STATE, client_method, keep, proximal_anchor, stored,
)
from flower_pfl.config import ExperimentConfig
from flower_pfl.data import ClientData
from flower_pfl.experiment import (
    dataset_shape, load_client_data, make_model, resolve_device, train_apfl_client, train_client, train_ditto_client, train_fedattn_client,
    train_igfl_client, train_per_fedavg_client, train_pfedme_client, train_scaffold_client,
)
from flower_pfl.layout import flatten_module, load_flat_
from flower_pfl.methods.apfl import EVALUATE_MIXED as APFL_MIXED, Mixture
from flower_pfl.methods.ditto import LAMBDA as DITTO_LAMBDA
from flower_pfl.methods.per_fedavg import ADAPT as PER_FEDAVG_ADAPT, ALPHA as PER_FEDAVG_ALPHA, adapt_one_step
from flower_pfl.methods.pfedme import EVALUATE_BOTH as PFEDME_PM_GM, LAMBDA as PFEDME_LAMBDA
from flower_pfl.metrics import GLOBAL_ACCURACY
from flower_pfl.methods.fedattn import BIAS_GRADIENT, REPRESENTATION
from flower_pfl.methods.base import ANCHOR
from flower_pfl.methods.scaffold import CONTROL_DELTA as SCAFFOLD_CONTROL_DELTA
from flower_pfl.solvers import evaluate as evaluate_model
from flower_pfl.wire import encode_vector, fingerprint

app = ClientApp()

#: evaluation metric: ``fingerprint`` of the model the node received (see the trust model in README)
MODEL_FINGERPRINT = "model-fingerprint"


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

    def fit(self, config: Mapping[str, Any]) -> tuple[dict[str, float], dict[str, bytes]]:
        """Train as ``config`` asks; returns the metrics and the extra bytes the server needs back."""
        payload: dict[str, bytes] = {}
        method = client_method(config)
        if method == "igfl-c":
            res = self._fit_igfl(config)
        elif method == "scaffold":
            res, payload = self._fit_scaffold(config)
        elif method == "ditto":
            personal = self._stored(DITTO_STATE)
            res, new = train_ditto_client(self.model, self.data, config, self.cfg.seed, self.partition_id,
                                          float(config[DITTO_LAMBDA]), personal[0] if personal else None)
            keep(self.state, DITTO_STATE, [new])
        elif method == "pfedme":
            res, theta = train_pfedme_client(self.model, self.data, config, self.cfg.seed, self.partition_id)
            keep(self.state, PFEDME_STATE, [theta])
        elif method == "apfl":
            res = self._fit_apfl(config)
        elif method == "per-fedavg":
            res = train_per_fedavg_client(self.model, self.data, config, self.cfg.seed, self.partition_id,
                                          float(config[PER_FEDAVG_ALPHA]))
        elif method == "fedattn":
            res, z, gradient = train_fedattn_client(self.model, self.data, config, self.cfg.seed, self.partition_id)
            payload = {REPRESENTATION: encode_vector(z), BIAS_GRADIENT: encode_vector(gradient)}
        else:
            anchor = proximal_anchor(config.get(ANCHOR), [p.detach() for p in self.model.parameters()], self.state)
            res = train_client(self.model, self.data, config, self.cfg.seed, self.partition_id, anchor=anchor)
        return {"train-loss": res.loss, "num-examples": self.data.num_train}, payload

    def _stored(self, key: str) -> list[torch.Tensor] | None:
        return stored(self.state, key)

    def _personal_apfl(self) -> tuple[torch.nn.Module, float] | None:
        """APFL's personal model and α from the node's state (``None`` before its first round)."""
        stored = self._stored(APFL_STATE)
        if stored is None:
            return None
        personal = make_model(self.cfg).to(next(self.model.parameters()).device)
        load_flat_(personal, stored[0])
        return personal, float(stored[1][0])

    def _fit_apfl(self, config: Mapping[str, Any]) -> Any:
        """APFL: the personal model starts as a copy of the first global model it receives."""
        known = self._personal_apfl()
        if known is None:
            personal = make_model(self.cfg).to(next(self.model.parameters()).device)
            personal.load_state_dict(self.model.state_dict())
            known = (personal, None)  # type: ignore[assignment]
        personal, alpha = known
        res, alpha = train_apfl_client(self.model, personal, self.data, config, self.cfg.seed, self.partition_id, alpha)
        keep(self.state, APFL_STATE, [flatten_module(personal), torch.tensor([alpha], dtype=torch.float32)])
        return res

    def _fit_igfl(self, config: Mapping[str, Any]) -> Any:
        """IGFL-C with this client's last delta from its state (none on its first participation)."""
        res, delta = train_igfl_client(self.model, self.data, config, self.cfg.seed, self.partition_id, self._stored(IGFL_STATE))
        keep(self.state, IGFL_STATE, delta)
        return res

    def _fit_scaffold(self, config: Mapping[str, Any]) -> tuple[Any, dict[str, bytes]]:
        """SCAFFOLD with this client's ``c_i`` from its state (zero before its first participation)."""
        res, control, delta = train_scaffold_client(self.model, self.data, config, self.cfg.seed, self.partition_id,
                                                    self._stored(SCAFFOLD_STATE))
        keep(self.state, SCAFFOLD_STATE, control)
        return res, {SCAFFOLD_CONTROL_DELTA: encode_vector(delta)}

    def evaluate(self, config: Mapping[str, Any] | None = None) -> dict[str, float]:
        """Evaluate on the test split the model this method personalizes from the received one:
        Ditto's personal model or pFedMe's θ_i from the node's state (pFedMe also reports the received
        global model), APFL's mixture of its personal model and the received one, Per-FedAvg's one step
        on the training split; otherwise the received model."""
        config = config or {}
        received = fingerprint(self.model.state_dict().values())  # before any personalization below
        device = next(self.model.parameters()).device
        extra: dict[str, float] = {}
        if PFEDME_PM_GM in config:
            extra[GLOBAL_ACCURACY] = self._test().accuracy
        personal = DITTO_STATE if DITTO_LAMBDA in config else PFEDME_STATE if PFEDME_PM_GM in config else None
        if personal is not None and (stored := self._stored(personal)):
            load_flat_(self.model, stored[0].to(device))
        elif PER_FEDAVG_ADAPT in config:
            adapt_one_step(self.model, self.data.x_train.to(device), self.data.y_train.to(device), float(config[PER_FEDAVG_ADAPT]))
        res = self._test(self._mixture() if APFL_MIXED in config else None)
        return {"loss": res.loss, "accuracy": res.accuracy, "num-examples": res.num_examples,
                "partition-id": self.partition_id, MODEL_FINGERPRINT: received, **extra}

    def _mixture(self) -> torch.nn.Module | None:
        known = self._personal_apfl()
        return Mixture(known[0], self.model, known[1]) if known is not None else None

    def _test(self, model: torch.nn.Module | None = None) -> Any:
        device = next(self.model.parameters()).device
        return evaluate_model(model or self.model, self.data.x_test.to(device), self.data.y_test.to(device))


def _is_legacy(msg: Message) -> bool:
    return any(key.startswith(("fitins.", "evaluateins.")) for key in msg.content.keys())


class _LegacyClient(NumPyClient):
    def __init__(self, node: Node) -> None:
        self.node = node

    def fit(self, parameters: list[np.ndarray], config: dict[str, Any]) -> tuple[list[np.ndarray], int, dict[str, Any]]:
        self.node.load(parameters)
        metrics, payload = self.node.fit(config)
        return self.node.arrays(), int(metrics.pop("num-examples")), {**metrics, **payload}

    def evaluate(self, parameters: list[np.ndarray], config: dict[str, Any]) -> tuple[float, int, dict[str, Any]]:
        self.node.load(parameters)
        metrics = self.node.evaluate(config)
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
    metrics, payload = node.fit(msg.content["config"])
    reply = RecordDict({
        "arrays": ArrayRecord({k: Array(a) for k, a in zip(received.keys(), node.arrays())}),
        "metrics": MetricRecord(metrics),
    })
    if payload:
        reply["payload"] = ConfigRecord(payload)
    return Message(content=reply, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    if _is_legacy(msg):
        return _legacy(msg, context)
    node = Node.from_context(context)
    node.load({k: v.numpy() for k, v in msg.content["arrays"].items()})
    config = msg.content["config"] if "config" in msg.content.config_records else {}
    return Message(content=RecordDict({"metrics": MetricRecord(node.evaluate(config))}), reply_to=msg)


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Tell the server this node's ``partition-id`` (to order nodes reproducibly) and its training
    label counts and most frequent label (only to group clients in diagnostic plots)."""
    node = Node.from_context(context)
    counts = torch.bincount(node.data.y_train, minlength=dataset_shape(node.cfg)[1])
    dominant = int(counts.argmax()) if node.data.num_train else -1
    info = {"partition-id": node.partition_id, "dominant-label": dominant, "label-counts": [int(c) for c in counts]}
    return Message(content=RecordDict({"metrics": MetricRecord(info)}), reply_to=msg)
