"""Fabricated Flower objects for driving strategies without Ray or a SuperLink."""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MessageType, MetricRecord, RecordDict
from flwr.common import Code, FitRes, GetPropertiesRes, Parameters, Status, ndarrays_to_parameters
from flwr.server.client_manager import SimpleClientManager
from flwr.server.client_proxy import ClientProxy

from client_apps.flower_internals import TaskIdentity
from flower_pfl.engine.model_facts import ModelFacts
from flower_pfl.experiment.models import build_model

#: a small named model (MLR on 3 features, 2 classes) for strategies driven with fabricated replies
NAMES = ("fc.weight", "fc.bias")
SHAPES = ((2, 3), (2,))


def model_arrays(value: float) -> dict[str, np.ndarray]:
    """A distinct model per value; different values give non-parallel vectors (cos < 1)."""
    return {n: np.full(s, value, np.float32) + np.arange(np.prod(s), dtype=np.float32).reshape(s)
            for n, s in zip(NAMES, SHAPES)}


@lru_cache(maxsize=32)
def facts(model: str, input_shape: tuple[int, ...] = (60,)) -> ModelFacts:
    """What a method may ask of package model ``model`` (``Method.check_model``), on Synthetic's features
    (or ``input_shape``)."""
    shape = (1, 28, 28) if model.startswith("cnn") and input_shape == (60,) else input_shape
    return ModelFacts.of_model(build_model(model, shape, 10))


def needs_bn(entry) -> bool:
    """Registry entry ``entry`` refuses a model without batch normalization (FedBN)."""
    return entry.check_model(facts("dnn")) is not None


def flat(arrays):
    """Named or listed arrays as one flat tensor."""
    import torch

    values = arrays.values() if isinstance(arrays, dict) else arrays
    return torch.cat([torch.as_tensor(np.asarray(a)).flatten() for a in values])


def sent(msg):
    """The flat model a Message-API instruction carries."""
    return flat({k: v.numpy() for k, v in msg.content["arrays"].items()})


def user_loop(model, step, x, y, *, lr: float, batch_size: int, steps: int, seed: int, loss_fn=None) -> dict:
    """What a user's own ClientApp does with a client algorithm's hooks (``client_apps.own_loop``' docstring):
    their SGD optimizer and loss on fresh minibatches, ``adjust_gradients`` between ``backward`` and
    ``step``, then ``finish``; returns the bytes for the server."""
    import torch
    import torch.nn.functional as F

    from flower_pfl.engine.minibatches import MinibatchStream

    loss_fn = loss_fn or F.cross_entropy
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    stream = MinibatchStream(len(y), batch_size, torch.Generator().manual_seed(seed))
    for _ in range(steps):
        idx = stream.next()
        optimizer.zero_grad()
        loss_fn(model(x[idx]), y[idx]).backward()
        step.adjust_gradients(model, (x[idx], y[idx]))
        optimizer.step()
    return step.finish(model, x)


def set_task_identity() -> None:
    """Messages can only be built inside a run; pretend to be a ServerApp task."""
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0


class FakeGrid:
    """Only what the strategies call: the connected node ids, and answers to QUERY messages: the
    metrics ``answers`` holds for a node, else the error of a ClientApp without ``@app.query()``.
    ``queried`` lists the nodes each ``send_and_receive`` call addressed."""

    def __init__(self, node_ids: Iterable[int], answers: dict[int, dict] | None = None) -> None:
        self.node_ids = list(node_ids)
        self.answers = dict(answers or {})
        self.queried: list[list[int]] = []

    def get_node_ids(self) -> list[int]:
        return list(self.node_ids)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        messages = list(messages)
        assert all(m.metadata.message_type == MessageType.QUERY for m in messages)
        self.queried.append([m.metadata.dst_node_id for m in messages])
        return [_reply(m, RecordDict({"metrics": MetricRecord(self.answers[m.metadata.dst_node_id])}))
                if m.metadata.dst_node_id in self.answers
                else _reply(m, None, error=Error(code=0, reason="ValueError: No query function registered with name 'default'"))
                for m in messages]


class FakeProxy(ClientProxy):
    """A legacy client proxy whose ``get_properties`` returns ``properties`` (None: a NumPyClient that
    does not override it; an exception: raised, as a grid's proxy raises an error reply)."""

    def __init__(self, cid: str, properties: dict | BaseException | None = None) -> None:
        super().__init__(cid)
        self.properties = properties
        self.asked = 0

    def get_properties(self, ins, timeout, group_id):
        self.asked += 1
        if isinstance(self.properties, BaseException):
            raise self.properties
        if self.properties is None:
            return GetPropertiesRes(Status(Code.GET_PROPERTIES_NOT_IMPLEMENTED, "not implemented"), {})
        return GetPropertiesRes(Status(Code.OK, ""), dict(self.properties))

    def get_parameters(self, *a, **k):  # pragma: no cover - never called
        raise NotImplementedError

    fit = evaluate = reconnect = get_parameters


def client_manager(cids: Iterable[str], properties: dict | None = None) -> SimpleClientManager:
    """Proxies for ``cids``; ``properties``: cid -> what its ``get_properties`` gives (see ``FakeProxy``)."""
    cm = SimpleClientManager()
    for cid in cids:
        cm.register(FakeProxy(cid, (properties or {}).get(cid)))
    return cm


def train_reply(to: Message, arrays: dict[str, np.ndarray], num_examples: int = 10, loss: float = 0.5,
                extras: dict | None = None) -> Message:
    """The reply a ClientApp would send to a training message (``extras``: a ConfigRecord of bytes)."""
    content = RecordDict({
        "arrays": ArrayRecord({k: Array(v) for k, v in arrays.items()}),
        "metrics": MetricRecord({"num-examples": num_examples, "train-loss": loss}),
    })
    if extras is not None:
        content["payload"] = ConfigRecord(extras)
    return _reply(to, content)


def eval_reply(to: Message, accuracy: float, num_examples: int) -> Message:
    return _reply(to, RecordDict({"metrics": MetricRecord({"accuracy": accuracy, "num-examples": num_examples, "loss": 1.0})}))


def error_reply(to: Message) -> Message:
    return _reply(to, None, error=Error(code=0, reason="client crashed"))


def _reply(to: Message, content: RecordDict | None, error: Error | None = None) -> Message:
    """A reply as a ClientApp makes it (its ``src_node_id`` is the node that was addressed)."""
    return Message(content, reply_to=to) if error is None else Message(error, reply_to=to)


def fit_res(arrays: list[np.ndarray], num_examples: int = 10, extras: dict | None = None) -> FitRes:
    return FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays), num_examples, {"train-loss": 0.5, **(extras or {})})


def parameters(arrays: list[np.ndarray]) -> Parameters:
    return ndarrays_to_parameters(arrays)
