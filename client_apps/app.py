"""The ClientApp: load this node's partition, run the client algorithm the server names.

It answers Message-API instructions (``arrays`` + ``config`` records, from
``strategies.message`` and Flower's Message-API strategies) and legacy ones
(``fitins.*`` / ``evaluateins.*``, from ``strategies`` and Flower's legacy
strategies), with the same training and evaluation code.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from functools import lru_cache
from logging import WARNING
from typing import Any, cast

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.client import Client, NumPyClient
from flwr.clientapp import ClientApp
from flwr.common.logger import log

from client_apps import persisted_state
from client_apps.client_states import ClientStates, state_node_config
from client_apps.flower_internals import handle_legacy_message_from_msgtype
from client_apps.hosting import CLIENTS_PER_COMPUTATION, HOSTING, HostingError, hosted_clients, hosts_itself
from client_apps.own_loop import RecordState
from client_apps.persisted_state import CLIENT_STATE, STATE_PARTITIONS, STATE_ROUNDS
from flower_pfl.engine.batched import ClientRound, train_together, unbatched, unbatched_evaluation
from flower_pfl.engine.client_algorithm import (
    BATCH_SIZE,
    FINETUNE_STEPS,
    LR,
    RESUMED_AFTER,
    SERVER_ROUND,
    ClientAlgorithm,
    Extras,
    LocalResult,
    TrainData,
    overrides,
    train_locally,
)
from flower_pfl.engine.evaluation import STACKED_BYTES, EvalResult, Personalization, evaluate_together
from flower_pfl.engine.evaluation import evaluate as evaluate_model
from flower_pfl.engine.last_call import LastCall
from flower_pfl.engine.memory import available_bytes, budget_bytes, clients_per_computation, model_bytes, shown, training_bytes
from flower_pfl.engine.precision import computing_in
from flower_pfl.engine.wire import fingerprint
from flower_pfl.engine.wording import counted
from flower_pfl.experiment.build import (
    client_generator,
    dataset_shape,
    load_client_data,
    make_model,
    resolve_device,
    training_settings,
)
from flower_pfl.experiment.clients import CLIENT_GROUP
from flower_pfl.experiment.config import ExperimentConfig
from flower_pfl.experiment.data import ClientData
from flower_pfl.experiment.data.placement import on_device
from flower_pfl.methods.registry import client_algorithm_for
from flower_pfl.run.cost import NODE_PEAK_MEMORY, TRAIN_TIME, peak_rss_mib
from flower_pfl.run.quiet import silence_runtime_noise
from strategies.arrays import array_numpy, numpy_record, record_numpy
from strategies.client_packs import Tally, is_pack, pack, unpack
from strategies.failures import listed
from strategies.records import config_record, metric_record, record_dict

silence_runtime_noise()  # loaded before Ray starts in a simulation, and in every Ray actor (flower_pfl.run.quiet)
app = ClientApp()

#: evaluation metric: ``fingerprint`` of the model the node received (see the trust model in ``docs/deployment.md``)
MODEL_FINGERPRINT = "model-fingerprint"
#: what a node's seeded draws are for (``Node.seeded_draws``)
PHASES = ("train", "evaluate")
#: why a node's clients train and evaluate one by one with ``batch-clients = false``
ONE_BY_ONE = "batch-clients = false"
#: why they do when they failed as one computation
FAILED_TOGETHER = ("the clients failed as one computation ({err!r}): they started again one by one, each from its "
                   "state before the message")


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
        return cls(cfg, pid, data, _thread_model(cfg), context.state,
                   state_node_config(context.node_config, cfg.client_state_dir))

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
        return _device(self.model)

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
            start = time.perf_counter()
            result, extras = train_locally(r.algorithm, self.model, r.data, steps=r.steps, lr=r.lr, batch_size=r.batch_size,
                                           generator=r.generator)
            seconds = time.perf_counter() - start
        return self.end_fit(result, seconds), extras

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

    def start_fit(self, config: Mapping[str, Any], copied: Callable[[torch.nn.Module], list[torch.Tensor]] | None = None) -> ClientRound:
        """What this node's training for ``config`` is (the model holds the received one): its client
        algorithm, data and settings. ``copied``: how the received model is copied (``Decoded.state``: one copy
        for the clients that received one model), else it is cloned."""
        algorithm = client_algorithm_for(config)(self.model, config, RecordState(self.state))
        received = copied(self.model) if copied is not None else [t.detach().clone() for t in self.model.state_dict().values()]
        return ClientRound(algorithm, self._train_data(), **training_settings(config, self.cfg.seed, self.partition_id),
                           received=received)

    def end_fit(self, result: LocalResult, seconds: float) -> dict[str, Any]:
        """The training metrics of ``result``, which took ``seconds`` of training (``train-time-s``), and the
        node's peak memory so far."""
        return {"train-loss": result.loss, "num-examples": self.data.num_train, TRAIN_TIME: seconds,
                NODE_PEAK_MEMORY: peak_rss_mib()}

    def clients_per_computation(self, algorithm: type[ClientAlgorithm], config: Mapping[str, Any]) -> int:
        """How many of a round's clients of ``algorithm`` this node trains as one computation: the node config's
        or the run config's ``clients-per-computation``, else as many as half its device's free memory holds
        (``flower_pfl.engine.memory``); ``MemoryError`` when not even one client's training fits in what is free."""
        asked = int(self.node_config.get(CLIENTS_PER_COMPUTATION, self.cfg.clients_per_computation))
        kept = (len(algorithm.batched_state) + len(algorithm.carried)) * model_bytes(self.model)
        if not self.data.num_train:  # nothing to measure a minibatch by
            return asked or sys.maxsize
        sample = self.data.x_train[0].to(self.device)
        per_client = training_bytes(self.model, sample, int(config.get(BATCH_SIZE, 1)), kept)
        if not asked and per_client > (free := available_bytes(self.device)):
            raise MemoryError(f"one client's training needs about {shown(per_client)} ({algorithm.__name__} on this "
                              f"model, batches of {config.get(BATCH_SIZE)}), and this node's {self.device} has "
                              f"{shown(free)} free: a smaller batch-size or model, or a machine with more memory")
        return clients_per_computation(per_client, budget_bytes(self.device), asked)

    def evaluate(self, config: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Evaluate on the test split the model the client algorithm ``config`` names makes from the
        received one (Ditto's personal model, pFedMe's θ_i with the global model's accuracy beside it,
        APFL's mixture, Per-FedAvg's one step on the training split; otherwise the received model)."""
        with self.computing():
            evaluation = self.start_evaluate(config or {})
            validation = self._val_data()
            return evaluation.metrics(self._test(evaluation.model),
                                      None if validation is None else evaluate_model(evaluation.model, *validation))

    def start_evaluate(self, config: Mapping[str, Any], received: int | None = None) -> Evaluation:
        """The model this node evaluates for ``config`` (the node's model holds the received one, whose
        ``fingerprint`` is ``received`` when known), and the metrics it adds. A client that never trains first
        takes the instruction's ``finetune-steps`` on its training part (``finetune``)."""
        if received is None:
            received = fingerprint(self.model.state_dict().values())  # before any personalization
        algorithm, steps = client_algorithm_for(config), int(config.get(FINETUNE_STEPS, 0))
        # the received model as it is, or the one the client's state keeps, takes no draws: nothing to seed
        with self.seeded_draws(config, "evaluate") if steps or overrides(algorithm, "evaluation_model") else nullcontext():
            if steps:
                self.finetune(config, steps)
            model, extra = algorithm.evaluation_model(self.model, config, RecordState(self.state), self._train_data(), self._test)
        return Evaluation(model, {"partition-id": self.partition_id, MODEL_FINGERPRINT: received, **extra})

    def finetune(self, config: Mapping[str, Any], steps: int) -> None:
        """``steps`` plain SGD steps of the node's model (the received one) on the client's training part, with
        the instruction's ``lr`` and ``batch-size`` (else the run config's): a new client's adaptation before it
        evaluates (FL-bench's ``finetune_epoch``, pFL-Bench's new clients)."""
        data = self._train_data()
        if not len(data.y):
            return
        generator = client_generator(self.cfg.seed, self.partition_id, int(config.get(SERVER_ROUND, 0)))
        train_locally(ClientAlgorithm(self.model, config), self.model, data, steps=steps, lr=float(config.get(LR, self.cfg.lr)),
                      batch_size=int(config.get(BATCH_SIZE, self.cfg.batch_size)), generator=generator)

    def _test_data(self) -> tuple[torch.Tensor, torch.Tensor]:
        data = on_device(self.data, self.device)
        return data.x_test, data.y_test

    def _val_data(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The client's validation part (``val-fraction``), or ``None`` without one."""
        if not self.data.has_validation:
            return None
        data = on_device(self.data, self.device)
        return data.x_val, data.y_val  # type: ignore[return-value]

    def _test(self, model: torch.nn.Module) -> EvalResult:
        return evaluate_model(model, *self._test_data())


@dataclass
class Evaluation:
    """A node's evaluation before its forward pass: the model it evaluates and the metrics it adds."""

    model: torch.nn.Module
    extra: dict[str, Any]

    def metrics(self, result: EvalResult, validation: EvalResult | None = None) -> dict[str, Any]:
        """The evaluation reply's metrics, with the model's ``result`` on the test split, where the client has a
        validation part its ``validation`` result (``val-accuracy``, ``val-loss``, ``val-num-examples``), and the
        node's peak memory."""
        val = {} if validation is None else {"val-loss": validation.loss, "val-accuracy": validation.accuracy,
                                            "val-num-examples": validation.num_examples}
        return {"loss": result.loss, "accuracy": result.accuracy, "num-examples": result.num_examples, **val, **self.extra,
                NODE_PEAK_MEMORY: peak_rss_mib()}


def run_settings(run_config: Mapping[str, Any]) -> ExperimentConfig:
    """The run config, parsed and checked once per process (``ExperimentConfig.from_mapping``); the clients of
    one message, which share their node's run config, look it up once."""
    return _settings(run_config)


@lru_cache(maxsize=4)
def _parsed(items: tuple[tuple[str, Any], ...]) -> ExperimentConfig:
    # the ServerApp refuses unknown keys; under another ServerApp the run config carries that app's own
    return ExperimentConfig.from_mapping(dict(items), ignore_unknown=True)


_settings: LastCall[Mapping[str, Any], ExperimentConfig] = LastCall(lambda run_config: _parsed(tuple(sorted(run_config.items()))))


@lru_cache(maxsize=8)
def _model(cfg: ExperimentConfig, thread: int) -> torch.nn.Module:
    """One model per configuration and thread: every message overwrites all of its tensors
    (``Node.load``) before using it, so nodes can share it."""
    return make_model(cfg).to(resolve_device(cfg.device))


#: this thread's model for a config: a message's clients ask with one config, hashed once
_thread_model: LastCall[ExperimentConfig, torch.nn.Module] = LastCall(lambda cfg: _model(cfg, threading.get_ident()))


def as_received(config: Mapping[str, Any]) -> bool:
    """Whether a client evaluates the model its instruction ``config`` sent as it is: no fine-tuning first, and a
    client algorithm whose evaluation model is the received one (``ClientAlgorithm.evaluation_model``'s, without an
    ``evaluated_state``)."""
    algorithm = client_algorithm_for(config)
    return not int(config.get(FINETUNE_STEPS, 0)) and algorithm.evaluated_state is None and not overrides(algorithm, "evaluation_model")


def _device(model: torch.nn.Module) -> torch.device:
    """Where ``model`` lives, looked up once per model: a node's model is made on its device and stays there
    (``_model``), and a message's clients, each a ``Node`` of its own, share it."""
    if (device := _DEVICES.get(model)) is None:
        device = _DEVICES[model] = next(model.parameters()).device
    return device


_DEVICES: weakref.WeakKeyDictionary[torch.nn.Module, torch.device] = weakref.WeakKeyDictionary()


def is_legacy(msg: Message) -> bool:
    return any(key.startswith(LEGACY_PREFIXES) for key in msg.content.keys())


#: how a legacy instruction's records are named (``fitins.config``, ``evaluateins.parameters``, ...)
LEGACY_PREFIXES = ("fitins.", "evaluateins.")


def _legacy_config(content: RecordDict) -> Mapping[str, Any]:
    """A legacy instruction's config (``fitins.config`` or ``evaluateins.config``)."""
    for prefix in LEGACY_PREFIXES:
        if isinstance(config := content.get(prefix + "config"), ConfigRecord):
            return config
    return {}


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
    """A legacy instruction (one client per node), the client's state kept once it has answered."""
    states = _states(context, hosted=False)
    client, partitions = int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    config = _legacy_config(msg.content)
    own = states.open(client, partitions, config, msg.metadata.message_type)
    node = Node.from_context(own)

    def client_fn(_: Context) -> Client:
        return _LegacyClient(node).to_client()

    reply = handle_legacy_message_from_msgtype(client_fn, msg, own)
    if not reply.has_error():
        states.keep(client, own, config, msg.metadata.message_type)
    return reply


@app.train()
def train(msg: Message, context: Context) -> Message:
    if is_legacy(msg):
        return _legacy(msg, context)
    return Message(content=_answer(msg.content, context, MessageType.TRAIN), reply_to=msg)


def _train(content: RecordDict, context: Context) -> RecordDict:
    """One client's reply to its training instruction ``content``."""
    node = Node.from_context(context)
    received = _arrays(content)
    node.load(record_numpy(received))
    metrics, payload = node.fit(content["config"])
    return _train_reply(list(received.keys()), node.arrays(), metrics, payload)


def _train_reply(names: list[str], arrays: list[np.ndarray], metrics: dict[str, Any], payload: Extras) -> RecordDict:
    reply: dict[str, ArrayRecord | ConfigRecord | MetricRecord] = {"arrays": numpy_record(dict(zip(names, arrays))),
                                                                    "metrics": metric_record(metrics)}
    if payload:
        reply["payload"] = config_record(payload)
    return record_dict(reply)


class Decoded:
    """``record_numpy`` once per array: a node's clients that received one model (a global model's) or one part of
    it (FedPer's base, made once by the server: ``flower_pfl.engine.wire.RoundArrays``) decode it once, and load it
    into the node's model once while the model holds it (``load``); a model's state is copied once while it stays
    the same (``state``)."""

    def __init__(self) -> None:
        #: by ``id``: each record and array is held, so no other object takes its id while this lives
        self._seen: dict[int, tuple[ArrayRecord, dict[str, np.ndarray]]] = {}
        self._arrays: dict[int, tuple[bytes, np.ndarray]] = {}  # by the ``id`` of an array's (immutable) bytes
        self._prints: dict[int, int] = {}
        self._loaded: tuple[Any, ...] | None = None  # the arrays last loaded, and the model's tensors as they were left
        self._states: dict[int, tuple[torch.nn.Module, tuple[Any, ...], list[torch.Tensor]]] = {}  # by the model's id

    def __call__(self, record: ArrayRecord) -> dict[str, np.ndarray]:
        if (seen := self._seen.get(id(record))) is None:
            seen = self._seen[id(record)] = (record, {name: self._array(array) for name, array in record.items()})
        return seen[1]

    def _array(self, array: Array) -> np.ndarray:
        """An array decoded once for all the arrays that hold its bytes (records copy ``Array`` objects, not
        their bytes)."""
        data = array.data
        if not isinstance(data, bytes):
            return array_numpy(array)
        if (seen := self._arrays.get(id(data))) is None:
            seen = self._arrays[id(data)] = (data, array_numpy(array))
        return seen[1]

    def load(self, node: Node, record: ArrayRecord) -> None:
        """``node.load(self(record))``, unless the node's model holds those arrays already: this message loaded
        them last, and none of its tensors has been replaced or written since (``_tensor_marks``)."""
        arrays, model = self(record), node.model
        tensors = list(model.state_dict().values())  # views that see the load's writes
        if self._loaded == (model, id(arrays), _tensor_marks(tensors)):
            return
        node.load(arrays)
        self._loaded = (model, id(arrays), _tensor_marks(tensors))

    def state(self, model: torch.nn.Module, entries: Mapping[str, torch.Tensor] | None = None) -> list[torch.Tensor]:
        """A copy of ``model``'s state (its ``state_dict``'s tensors, ``entries`` where already read), the one made
        before while none of them has been replaced or written since: clients evaluating one model share one copy."""
        entries = model.state_dict() if entries is None else entries
        marks = _tensor_marks(entries.values())
        kept = self._states.get(id(model))
        if kept is None or kept[0] is not model or kept[1] != marks:
            kept = self._states[id(model)] = (model, marks, [t.detach().clone() for t in entries.values()])
        return kept[2]

    def fingerprint(self, record: ArrayRecord) -> int:
        """``fingerprint`` of the record's arrays, the model a client received (once per record)."""
        arrays = self(record)
        if (crc := self._prints.get(id(record))) is None:
            crc = self._prints[id(record)] = fingerprint(arrays.values())
        return crc


def _tensor_marks(tensors: Iterable[torch.Tensor]) -> tuple[tuple[int, int], ...]:
    """What changes when a tensor is replaced or written in place: its storage and its version (which every
    in-place operation raises, through ``detach``ed views too)."""
    return tuple((t.data_ptr(), t._version) for t in tensors)


def train_round(contents: Sequence[RecordDict], contexts: Sequence[Context]) -> tuple[list[RecordDict] | None, str]:
    """The replies ``train`` gives to clients' training instructions (Message API), the clients trained as
    one computation (``flower_pfl.engine.batched``), with a line on what ran; ``None`` and why when
    they cannot be (another client algorithm each, or one that cannot run batched)."""
    configs = [c["config"] for c in contents]
    algorithms = {client_algorithm_for(c) for c in configs}
    nodes = [Node.from_context(c) for c in contexts]
    model = nodes[0].model
    if len(algorithms) > 1:
        return None, f"the round's clients run {len(algorithms)} client algorithms"
    (algorithm,) = algorithms
    if (why := unbatched(algorithm, model)) is not None:
        return None, f"{algorithm.__name__}: {why}"
    chunk = nodes[0].clients_per_computation(algorithm, configs[0])
    replies, decoded = [], Decoded()
    for start in range(0, len(contents), chunk):  # a chunk of the clients, all the way to their replies
        part = range(start, min(start + chunk, len(contents)))
        rounds, names = [], []
        for i in part:
            received = _arrays(contents[i])
            decoded.load(nodes[i], received)
            rounds.append(nodes[i].start_fit(configs[i], decoded.state))
            names.append(list(received.keys()))
        with nodes[0].computing():
            began = time.perf_counter()
            trained = train_together(model, rounds)
            seconds = (time.perf_counter() - began) / len(part)  # each client's share of the computation
        replies += [_train_reply(name, [t.cpu().numpy() for t in tensors], nodes[i].end_fit(result, seconds), extras)
                    for i, name, (tensors, result, extras) in zip(part, names, trained)]
    computations = "" if chunk >= len(contents) else f" ({-(-len(contents) // chunk)} of at most {chunk}, to fit the node's memory)"
    return replies, f"{algorithm.__name__}: {counted(len(contents), 'client')} as one computation{computations}"


def evaluate_round(contents: Sequence[RecordDict], contexts: Sequence[Context]) -> tuple[list[RecordDict], list[str | None]]:
    """The replies ``evaluate`` gives to clients' evaluation instructions (Message API), the forward passes of
    the clients that evaluate a model of the run's architecture as one computation
    (``flower_pfl.engine.evaluation.evaluate_together``); and, per client, why its forward pass ran on its
    own (``None``: with the round's)."""
    nodes = [Node.from_context(c) for c in contexts]
    model = nodes[0].model
    why = unbatched_evaluation(model)
    with nodes[0].computing():
        return _evaluate_nodes(nodes, contents, model, why)


def _evaluate_nodes(nodes: Sequence[Node], contents: Sequence[RecordDict], model: torch.nn.Module,
                    why: str | None) -> tuple[list[RecordDict], list[str | None]]:
    configs = [_config(c) for c in contents]
    evaluations: list[Evaluation] = []
    results: list[EvalResult | None] = []
    validations: list[EvalResult | None] = []  # on the validation parts (``None``: a client without one)
    reasons: list[str | None] = []
    Place = tuple[list[EvalResult | None], int]  # where a result goes: the test results' or the validation results' list
    kinds: dict[Any, tuple[torch.nn.Module, list[Place], list[list[torch.Tensor]], list[tuple[torch.Tensor, torch.Tensor]]]] = {}

    def run(kind: Any) -> None:  # the kind's gathered clients, as one computation
        architecture, places, states, tests = kinds.pop(kind)
        for (target, i), result in zip(places, evaluate_together(architecture, states, tests)):
            target[i] = result

    decoded = Decoded()
    held: Held | None = None  # the last client's model as it received it
    for node, content, config in zip(nodes, contents, configs):
        received, plain = _arrays(content), why is None and as_received(config)
        evaluation, kind, state = _started(node, received, config, held if plain else None, decoded)
        evaluations.append(evaluation)
        evaluated = evaluation.model
        if why is None and (evaluated is model or isinstance(evaluated, Personalization)):
            # the received model, or a personalization of it: its tensors join those of its kind
            if state is None:
                entries = evaluated.state_dict()
                kind = (type(evaluated), tuple((k, tuple(v.shape), v.dtype) for k, v in entries.items()))
                state = decoded.state(evaluated, entries)
            held = (received, evaluation.extra[MODEL_FINGERPRINT], kind, state) if plain else None
            _, places, states, tests = kinds.setdefault(kind, (evaluated, [], [], []))
            places.append((results, len(results)))
            states.append(state)
            tests.append(node._test_data())
            results.append(None)
            validations.append(None)
            if (validation := node._val_data()) is not None:  # the same model on the validation part: no second copy
                places.append((validations, len(validations) - 1))
                states.append(state)
                tests.append(validation)
            reasons.append(None)
            if len(states) * sum(t.numel() * t.element_size() for t in states[0]) >= STACKED_BYTES:
                run(kind)  # a bounded stack: a federation's models need not fit on the device at once
        else:  # a model of another making (a nearest-neighbour mixture): evaluated now
            results.append(node._test(evaluated))
            validation = node._val_data()
            validations.append(None if validation is None else evaluate_model(evaluated, *validation))
            reasons.append(why or f"{client_algorithm_for(config).__name__}: its {type(evaluated).__name__} is evaluated client by "
                                  "client (not a Personalization: what differs between clients is not all in its state_dict)")
    for kind in list(kinds):
        run(kind)
    replies = [record_dict({"metrics": metric_record(e.metrics(r, v))})
               for e, r, v in zip(evaluations, cast(list[EvalResult], results), validations)]  # every result is in
    return replies, reasons


#: a client's received model, its fingerprint, kind and copy (``_evaluate_nodes``)
Held = tuple[ArrayRecord, int, Any, list[torch.Tensor]]


def _started(node: Node, received: ArrayRecord, config: Mapping[str, Any], held: Held | None,
             decoded: Decoded) -> tuple[Evaluation, Any, list[torch.Tensor] | None]:
    """A client's evaluation before its forward pass, and the kind and copy of its model where ``held`` (the last
    client's, ``as_received``) is the model it evaluates: no load, no copy."""
    if held is not None and held[0] is received:
        _, crc, kind, state = held
        return Evaluation(node.model, {"partition-id": node.partition_id, MODEL_FINGERPRINT: crc}), kind, state
    decoded.load(node, received)
    return node.start_evaluate(config, decoded.fingerprint(received)), None, None


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    if is_legacy(msg):
        return _legacy(msg, context)
    return Message(content=_answer(msg.content, context, MessageType.EVALUATE), reply_to=msg)


def _evaluate(content: RecordDict, context: Context) -> RecordDict:
    """One client's reply to its evaluation instruction ``content``."""
    node = Node.from_context(context)
    node.load(record_numpy(_arrays(content)))
    return RecordDict({"metrics": MetricRecord(node.evaluate(_config(content)))})


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Tell the server this node's ``partition-id`` (to order nodes reproducibly), the federation's
    ``num-partitions``, its training label counts and most frequent label (only to group clients in
    diagnostic plots), and the natural group or domain its data come from (for the summary); in a resumed
    run, also whether it lacks the client state the checkpoint needs (``persisted_state.missing``). A node
    that hosts several clients answers for each of them (a pack, ``strategies.client_packs``)."""
    return Message(content=_answer(msg.content, context, MessageType.QUERY), reply_to=msg)


def _query(content: RecordDict, context: Context) -> RecordDict:
    """One client's answer to the query ``content``."""
    try:
        node = Node.from_context(context)
    except Exception as err:  # in a cluster, say which machine could not load its data
        raise RuntimeError(f"on host {socket.gethostname()}: {err}") from err
    counts = torch.bincount(node.data.y_train, minlength=dataset_shape(node.cfg)[1])
    dominant = int(counts.argmax()) if node.data.num_train else -1
    info: dict[str, Any] = {"partition-id": node.partition_id, "num-partitions": int(context.node_config["num-partitions"]),
                            "dominant-label": dominant, "label-counts": [int(c) for c in counts]}
    reply = RecordDict({"metrics": MetricRecord(info)})
    if node.data.group:
        reply[CLIENT_GROUP] = ConfigRecord({CLIENT_GROUP: node.data.group})
    config = _config(content)
    if RESUMED_AFTER in config:
        needed = dict(zip(config[STATE_PARTITIONS], config[STATE_ROUNDS]))
        if node.partition_id in needed and (problem := persisted_state.missing(
                node.node_config, config, node.partition_id, int(needed[node.partition_id]))):
            reply[CLIENT_STATE] = ConfigRecord({"missing": problem})
    return reply


#: a phase's answer for one client, and for a node's clients together
_ONE = {MessageType.TRAIN: _train, MessageType.EVALUATE: _evaluate, MessageType.QUERY: _query}


def _answer(content: RecordDict, context: Context, phase: str) -> RecordDict:
    """The reply to an instruction of ``phase``: the client's own where the node is its one client, else a
    pack with each hosted client's (``client_apps.hosting``). A client's state is as before the message
    until the client has answered (``client_apps.client_states``)."""
    cfg, packed = run_settings(context.run_config), is_pack(content)
    try:
        hosted = packed or not hosts_itself(context.node_config, cfg.num_clients)
        clients, total = hosted_clients(context.node_config, cfg.num_clients)
    except HostingError as err:
        if phase != MessageType.QUERY:
            raise
        return RecordDict({HOSTING: ConfigRecord({HOSTING: str(err)})})  # the server names it, and stops at start
    states = _states(context, hosted)
    if not hosted:
        client, partitions = int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
        own = states.open(client, partitions, _config(content), phase)
        reply = _ONE[phase](content, own)
        states.keep(client, own, _config(content), phase)
        return reply
    if not packed and phase != MessageType.QUERY:
        raise ValueError(f"this node hosts clients {listed(clients)}: it answers a {phase} instruction for each of "
                         "them in one message (a pack, strategies.client_packs), as this package's ServerApp "
                         "sends; a server that sends one message per node needs one client per node (num-clients = 0)")
    contents = unpack(content)[0] if packed else {c: content for c in clients}  # a plain query asks them all
    mine = set(clients)
    errors = {c: repr(ValueError(f"client {c} is not hosted by this node (it hosts {listed(clients)})"))
              for c in contents if c not in mine}
    asked = {c: x for c, x in contents.items() if c in mine}
    replies, failed, tally = _hosted(asked, Hosted(states, total, phase), cfg.batch_clients)
    return pack(replies, {**errors, **failed}, tally.record() if phase != MessageType.QUERY else None)


def _states(context: Context, hosted: bool) -> ClientStates:
    """Where the clients of a message to the node of ``context`` keep their state (``client_apps.client_states``)."""
    cfg = run_settings(context.run_config)
    return ClientStates(context, state_node_config(context.node_config, cfg.client_state_dir), cfg.checkpoint_every, hosted)


def _config(content: RecordDict) -> Mapping[str, Any]:
    config = content.get("config")
    return config if isinstance(config, ConfigRecord) else {}


def _arrays(content: RecordDict) -> ArrayRecord:
    """An instruction's model (not ``content.array_records[...]``: that builds a checked copy of the records)."""
    arrays = content["arrays"]
    if not isinstance(arrays, ArrayRecord):
        raise TypeError(f"the instruction's 'arrays' is a {type(arrays).__name__}, not an ArrayRecord")
    return arrays


@dataclass
class Hosted:
    """A node's clients in one message of ``phase``: each client's ``Context`` as before the message, and
    its state kept once it has answered (``ClientStates``)."""

    states: ClientStates
    total: int
    phase: str

    def open(self, client: int, content: RecordDict) -> Context:
        return self.states.open(client, self.total, _config(content), self.phase)

    def keep(self, client: int, context: Context, content: RecordDict) -> None:
        self.states.keep(client, context, _config(content), self.phase)


def _hosted(contents: dict[int, RecordDict], hosted: Hosted,
            together: bool) -> tuple[dict[int, RecordDict], dict[int, str], Tally]:
    """The replies of a node's clients to their instructions, trained or evaluated as one computation where
    ``together`` and their client algorithm allow, else one by one; the reasons of the clients that failed;
    how they ran. Clients that fail together start again one by one, each from its state before the message."""
    tally, clients, phase = Tally(), list(contents), hosted.phase
    answers: dict[int, RecordDict] = {}
    errors: dict[int, str] = {}
    if together and clients and phase != MessageType.QUERY:
        batched = train_round if phase == MessageType.TRAIN else evaluate_round
        contexts: dict[int, Context] = {}
        replies: list[RecordDict] | None = None
        try:
            contexts = {c: hosted.open(c, contents[c]) for c in clients}
            replies, how = batched([contents[c] for c in clients], [contexts[c] for c in clients])
        except Exception as err:  # e.g. one client's malformed instruction: each client is answered on its own
            log(WARNING, "%s", FAILED_TOGETHER.format(err=err))
            tally.apart(FAILED_TOGETHER.format(err=err), len(clients))
        else:
            if phase == MessageType.EVALUATE:  # a forward pass on its own counts as one by one
                for why in cast(list[str | None], how):
                    tally.together += why is None
                    if why is not None:
                        tally.apart(why)
            elif replies is not None:
                tally.together += len(clients)
            else:
                tally.apart(cast(str, how), len(clients))
        if replies is not None:
            for client, reply in zip(clients, replies):
                _kept(client, reply, contexts[client], contents[client], hosted, answers, errors)
            return answers, errors, tally
    elif clients and phase != MessageType.QUERY:
        tally.apart(ONE_BY_ONE, len(clients))
    for client in clients:
        try:
            context = hosted.open(client, contents[client])
            reply = _ONE[phase](contents[client], context)
        except Exception as err:  # one client's failure is its own
            errors[client] = repr(err)
        else:
            _kept(client, reply, context, contents[client], hosted, answers, errors)
    return answers, errors, tally


def _kept(client: int, reply: RecordDict, context: Context, content: RecordDict, hosted: Hosted,
          answers: dict[int, RecordDict], errors: dict[int, str]) -> None:
    """``client``'s ``reply`` goes out once its state is kept; a client whose state cannot be kept fails."""
    try:
        hosted.keep(client, context, content)
    except Exception as err:
        errors[client] = repr(err)
    else:
        answers[client] = reply
