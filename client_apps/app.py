"""The ClientApp: load this node's partition, run the client algorithm the server names.

It answers Message-API instructions (``arrays`` + ``config`` records, from
``strategies.message`` and Flower's Message-API strategies) and legacy ones
(``fitins.*`` / ``evaluateins.*``, from ``strategies`` and Flower's legacy
strategies), with the same training and evaluation code.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, cast

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.client import Client, NumPyClient
from flwr.clientapp import ClientApp

from client_apps import persisted_state
from client_apps.flower_internals import handle_legacy_message_from_msgtype
from client_apps.own_loop import RecordState
from client_apps.persisted_state import CLIENT_STATE, STATE_PARTITIONS, STATE_ROUNDS
from flower_pfl.engine.batched import ClientRound, train_together, unbatched, unbatched_evaluation
from flower_pfl.engine.client_algorithm import RESUMED_AFTER, SERVER_ROUND, Extras, LocalResult, TrainData, train_locally
from flower_pfl.engine.evaluation import STACKED_BYTES, EvalResult, Personalization, evaluate_together
from flower_pfl.engine.evaluation import evaluate as evaluate_model
from flower_pfl.engine.precision import computing_in
from flower_pfl.engine.wire import fingerprint
from flower_pfl.engine.wording import counted
from flower_pfl.experiment.build import dataset_shape, load_client_data, make_model, resolve_device, training_settings
from flower_pfl.experiment.clients import CLIENT_GROUP
from flower_pfl.experiment.config import ExperimentConfig
from flower_pfl.experiment.data import ClientData
from flower_pfl.experiment.data.placement import on_device
from flower_pfl.methods.registry import client_algorithm_for
from flower_pfl.run.quiet import silence_runtime_noise
from strategies.arrays import numpy_record, record_numpy

silence_runtime_noise()  # loaded before Ray starts in a simulation, and in every Ray actor (flower_pfl.run.quiet)
app = ClientApp()

#: evaluation metric: ``fingerprint`` of the model the node received (see the trust model in ``docs/deployment.md``)
MODEL_FINGERPRINT = "model-fingerprint"
#: what a node's seeded draws are for (``Node.seeded_draws``)
PHASES = ("train", "evaluate")


@dataclass
class Node:
    """What one node needs for a round: its config, data and a model to load parameters into."""

    cfg: ExperimentConfig
    partition_id: int
    data: ClientData
    model: torch.nn.Module
    state: RecordDict
    node_config: Mapping[str, Any]

    @classmethod
    def from_context(cls, context: Context) -> Node:
        """This message's node. What does not change between messages (the parsed run config, the
        partition, a model to load parameters into) is made once per process and reused (a Ray actor
        serves many nodes, many rounds); the state is the message's own."""
        cfg = run_settings(context.run_config)
        pid = int(context.node_config["partition-id"])
        data = load_client_data(cfg, pid, int(context.node_config["num-partitions"]))
        # the run config names the client-state folder where the node config does not (a Ray cluster's actors)
        node_config = {**({"client-state-dir": cfg.client_state_dir} if cfg.client_state_dir else {}), **context.node_config}
        return cls(cfg, pid, data, _model(cfg, threading.get_ident()), context.state, node_config)

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

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _train_data(self) -> TrainData:
        data = on_device(self.data, self.device)  # kept on the device for the run when it fits
        return TrainData(data.x_train, data.y_train)

    def computing(self) -> AbstractContextManager[None]:
        """The arithmetic of the run config's ``precision`` (float32 by default)."""
        return computing_in(self.cfg.precision, self.device)

    def fit(self, config: Mapping[str, Any]) -> tuple[dict[str, Any], Extras]:
        """Train with the client algorithm ``config`` names; returns the metrics and what the server
        needs back (the algorithm's bytes and receipt, ``ClientAlgorithm.finish``)."""
        r = self.start_fit(config)
        with self.seeded_draws(config, "train"), self.computing():
            result, extras = train_locally(r.algorithm, self.model, r.data, steps=r.steps, lr=r.lr, batch_size=r.batch_size,
                                           generator=r.generator)
        return self.end_fit(config, result), extras

    @contextmanager
    def seeded_draws(self, config: Mapping[str, Any], phase: str) -> Iterator[None]:
        """Torch's global random state, for one message, seeded by the run's seed, this client, the round and
        ``phase``, and restored after: the model's own draws (dropout) repeat run after run, whichever
        process serves the client."""
        device = self.device
        seed = np.random.SeedSequence([self.cfg.seed, self.partition_id, int(config.get(SERVER_ROUND, 0)),
                                       PHASES.index(phase)]).generate_state(1)[0]
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.default_generator.manual_seed(int(seed))  # not torch.manual_seed: it also seeds every GPU, slowly
            if device.type == "cuda":
                with torch.cuda.device(device):
                    torch.cuda.manual_seed(int(seed))
            yield

    def start_fit(self, config: Mapping[str, Any]) -> ClientRound:
        """What this node's training for ``config`` is (the model holds the received one): its client
        algorithm, data and settings, with the client state restored."""
        persisted_state.restore(self.state, self.node_config, config, self.partition_id)
        algorithm = client_algorithm_for(config)(self.model, config, RecordState(self.state))
        return ClientRound(algorithm, self._train_data(), **training_settings(config, self.cfg.seed, self.partition_id),
                           received=[t.detach().clone() for t in self.model.state_dict().values()])

    def end_fit(self, config: Mapping[str, Any], result: LocalResult) -> dict[str, Any]:
        """Keep the client state (``persisted_state``); the training metrics of ``result``."""
        persisted_state.persist(self.state, self.node_config, config, self.partition_id, int(config.get(SERVER_ROUND, 0)),
                                self.cfg.checkpoint_every)
        return {"train-loss": result.loss, "num-examples": self.data.num_train}

    def evaluate(self, config: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Evaluate on the test split the model the client algorithm ``config`` names makes from the
        received one (Ditto's personal model, pFedMe's θ_i with the global model's accuracy beside it,
        APFL's mixture, Per-FedAvg's one step on the training split; otherwise the received model)."""
        with self.computing():
            evaluation = self.start_evaluate(config or {})
            return evaluation.metrics(self._test(evaluation.model))

    def start_evaluate(self, config: Mapping[str, Any]) -> Evaluation:
        """The model this node evaluates for ``config`` (the node's model holds the received one), with the
        client state restored, and the metrics it adds."""
        persisted_state.restore(self.state, self.node_config, config, self.partition_id)
        received = fingerprint(self.model.state_dict().values())  # before any personalization
        algorithm = client_algorithm_for(config)
        with self.seeded_draws(config, "evaluate"):
            model, extra = algorithm.evaluation_model(self.model, config, RecordState(self.state), self._train_data(), self._test)
        return Evaluation(model, {"partition-id": self.partition_id, MODEL_FINGERPRINT: received, **extra})

    def _test_data(self) -> tuple[torch.Tensor, torch.Tensor]:
        data = on_device(self.data, self.device)
        return data.x_test, data.y_test

    def _test(self, model: torch.nn.Module) -> EvalResult:
        return evaluate_model(model, *self._test_data())


@dataclass
class Evaluation:
    """A node's evaluation before its forward pass: the model it evaluates and the metrics it adds."""

    model: torch.nn.Module
    extra: dict[str, Any]

    def metrics(self, result: EvalResult) -> dict[str, Any]:
        """The evaluation reply's metrics, with the model's ``result`` on the test split."""
        return {"loss": result.loss, "accuracy": result.accuracy, "num-examples": result.num_examples, **self.extra}


def run_settings(run_config: Mapping[str, Any]) -> ExperimentConfig:
    """The run config, parsed and checked once per process (``ExperimentConfig.from_mapping``)."""
    return _parsed(tuple(sorted(run_config.items())))


@lru_cache(maxsize=4)
def _parsed(items: tuple[tuple[str, Any], ...]) -> ExperimentConfig:
    # the ServerApp refuses unknown keys; under another ServerApp the run config carries that app's own
    return ExperimentConfig.from_mapping(dict(items), ignore_unknown=True)


@lru_cache(maxsize=8)
def _model(cfg: ExperimentConfig, thread: int) -> torch.nn.Module:
    """One model per configuration and thread: every message overwrites all of its tensors
    (``Node.load``) before using it, so nodes can share it."""
    return make_model(cfg).to(resolve_device(cfg.device))


def is_legacy(msg: Message) -> bool:
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
    if is_legacy(msg):
        return _legacy(msg, context)
    node = Node.from_context(context)
    received = msg.content.array_records["arrays"]
    node.load(record_numpy(received))
    metrics, payload = node.fit(msg.content["config"])
    return _train_reply(msg, list(received.keys()), node.arrays(), metrics, payload)


def _train_reply(msg: Message, names: list[str], arrays: list[np.ndarray], metrics: dict[str, Any], payload: Extras) -> Message:
    reply = RecordDict({"arrays": numpy_record(dict(zip(names, arrays))), "metrics": MetricRecord(metrics)})
    if payload:
        reply["payload"] = ConfigRecord(dict[str, Any](payload))
    return Message(content=reply, reply_to=msg)


def train_round(messages: Sequence[Message], contexts: Sequence[Context]) -> tuple[list[Message] | None, str]:
    """The replies ``train`` gives to a round's training messages (Message API), the clients trained as
    one computation (``flower_pfl.engine.batched``), with a line on what ran; ``None`` and why when
    they cannot be (another client algorithm each, or one that cannot run batched)."""
    configs = [m.content["config"] for m in messages]
    algorithms = {client_algorithm_for(c) for c in configs}
    nodes = [Node.from_context(c) for c in contexts]
    model = nodes[0].model
    if len(algorithms) > 1:
        return None, f"the round's clients run {len(algorithms)} client algorithms"
    (algorithm,) = algorithms
    if (why := unbatched(algorithm, model)) is not None:
        return None, f"{algorithm.__name__}: {why}"
    rounds, names = [], []
    for node, msg, config in zip(nodes, messages, configs):
        received = msg.content.array_records["arrays"]
        node.load(record_numpy(received))
        rounds.append(node.start_fit(config))
        names.append(list(received.keys()))
    replies = []
    with nodes[0].computing():
        trained = train_together(model, rounds)
    for node, msg, config, name, (tensors, result, extras) in zip(nodes, messages, configs, names, trained):
        arrays = [t.cpu().numpy() for t in tensors]
        replies.append(_train_reply(msg, name, arrays, node.end_fit(config, result), extras))
    return replies, f"{algorithm.__name__}: {counted(len(messages), 'client')} as one computation"


def evaluate_round(messages: Sequence[Message], contexts: Sequence[Context]) -> tuple[list[Message], list[str | None]]:
    """The replies ``evaluate`` gives to a round's evaluation messages (Message API), the forward passes of
    the clients that evaluate a model of the run's architecture as one computation
    (``flower_pfl.engine.evaluation.evaluate_together``); and, per message, why its forward pass ran on its
    own (``None``: with the round's)."""
    nodes = [Node.from_context(c) for c in contexts]
    model = nodes[0].model
    why = unbatched_evaluation(model)
    with nodes[0].computing():
        return _evaluate_nodes(nodes, messages, model, why)


def _evaluate_nodes(nodes: Sequence[Node], messages: Sequence[Message], model: torch.nn.Module,
                    why: str | None) -> tuple[list[Message], list[str | None]]:
    configs = [_evaluation_config(m) for m in messages]
    evaluations: list[Evaluation] = []
    results: list[EvalResult | None] = []
    reasons: list[str | None] = []
    kinds: dict[Any, tuple[torch.nn.Module, list[int], list[list[torch.Tensor]], list[tuple[torch.Tensor, torch.Tensor]]]] = {}

    def run(kind: Any) -> None:  # the kind's gathered clients, as one computation
        architecture, positions, states, tests = kinds.pop(kind)
        for i, result in zip(positions, evaluate_together(architecture, states, tests)):
            results[i] = result

    for node, msg, config in zip(nodes, messages, configs):
        node.load(record_numpy(msg.content.array_records["arrays"]))
        evaluation = node.start_evaluate(config)
        evaluations.append(evaluation)
        evaluated = evaluation.model
        if why is None and (evaluated is model or isinstance(evaluated, Personalization)):
            # the received model, or a personalization of it: its tensors join those of its kind
            entries = evaluated.state_dict()
            kind = (type(evaluated), tuple((k, tuple(v.shape), v.dtype) for k, v in entries.items()))
            _, positions, states, tests = kinds.setdefault(kind, (evaluated, [], [], []))
            positions.append(len(results))
            states.append([t.detach().clone() for t in entries.values()])
            tests.append(node._test_data())
            results.append(None)
            reasons.append(None)
            if len(states) * sum(t.numel() * t.element_size() for t in states[0]) >= STACKED_BYTES:
                run(kind)  # a bounded stack: a federation's models need not fit on the device at once
        else:  # a model of another making (a nearest-neighbour mixture): evaluated now
            results.append(node._test(evaluated))
            reasons.append(why or f"{client_algorithm_for(config).__name__}: its {type(evaluated).__name__} is evaluated client by "
                                  "client (not a Personalization: what differs between clients is not all in its state_dict)")
    for kind in list(kinds):
        run(kind)
    replies = [Message(content=RecordDict({"metrics": MetricRecord(e.metrics(r))}), reply_to=msg)
               for e, r, msg in zip(evaluations, cast(list[EvalResult], results), messages)]  # every result is in
    return replies, reasons


def _evaluation_config(msg: Message) -> Mapping[str, Any]:
    return msg.content.config_records["config"] if "config" in msg.content.config_records else {}


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    if is_legacy(msg):
        return _legacy(msg, context)
    node = Node.from_context(context)
    node.load(record_numpy(msg.content.array_records["arrays"]))
    return Message(content=RecordDict({"metrics": MetricRecord(node.evaluate(_evaluation_config(msg)))}), reply_to=msg)


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Tell the server this node's ``partition-id`` (to order nodes reproducibly) and its training
    label counts and most frequent label (only to group clients in diagnostic plots), and the natural
    group or domain its data come from (for the summary); in a resumed run, also whether it lacks the
    client state the checkpoint needs (``persisted_state.missing``)."""
    try:
        node = Node.from_context(context)
    except Exception as err:  # in a cluster, say which machine could not load its data
        raise RuntimeError(f"on host {socket.gethostname()}: {err}") from err
    counts = torch.bincount(node.data.y_train, minlength=dataset_shape(node.cfg)[1])
    dominant = int(counts.argmax()) if node.data.num_train else -1
    info: dict[str, Any] = {"partition-id": node.partition_id, "dominant-label": dominant, "label-counts": [int(c) for c in counts]}
    reply = RecordDict({"metrics": MetricRecord(info)})
    if node.data.group:
        reply[CLIENT_GROUP] = ConfigRecord({CLIENT_GROUP: node.data.group})
    config: Mapping[str, Any] = msg.content.config_records.get("config", {})
    if RESUMED_AFTER in config:
        needed = dict(zip(config[STATE_PARTITIONS], config[STATE_ROUNDS]))
        if node.partition_id in needed and (problem := persisted_state.missing(
                node.node_config, config, node.partition_id, int(needed[node.partition_id]))):
            reply[CLIENT_STATE] = ConfigRecord({"missing": problem})
    return Message(content=reply, reply_to=msg)
