"""A round in which no node answers, or none is there to ask, goes by as in Flower's FedAvg, for every
registry entry in both APIs: the strategy returns, says so in a line rather than a traceback, the
round changes no model, and the next round trains as if the empty one had not been.

Replies are fabricated (the sent model moved a little, the method's ``example_extras`` and the client
algorithm's receipt), so no client trains and the whole file runs in seconds.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import fabricate as fb
import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.common import Code, EvaluateRes, Status, parameters_to_ndarrays
from flwr.server import ServerConfig
from test_twins import NODES, _assert_same_state, _model

from client_apps.flower_internals import start_grid
from flower_pfl.engine.client_algorithm import CLIENT_ALGORITHM
from flower_pfl.experiment.config import ExperimentConfig
from flower_pfl.methods.registry import entries
from server_apps.factory import build_legacy_strategy, build_message_strategy
from server_apps.inprocess import in_process_grid

ENTRIES = [pytest.param(e, id=e.label) for e in entries()]
OURS = [pytest.param(e, id=e.label) for e in entries() if not e.builtin]
APIS = ["message", "legacy"]
#: every node's rank, answered to the strategies' rank query
RANKS = {n: {"partition-id": i} for i, n in enumerate(NODES)}
RANKS_BY_CID = {str(n): ranks for n, ranks in RANKS.items()}


class Run:
    """A strategy of registry entry ``entry`` in ``api`` as a run's factory builds it (3 of the 5 nodes train,
    no waiting for missing nodes), driven round by round with fabricated replies."""

    def __init__(self, entry: Any, api: str, lost_node_rounds: int = 3) -> None:
        fb.set_task_identity()
        bn = fb.needs_bn(entry)
        self.cfg = ExperimentConfig(method=entry.method, aggregation=entry.aggregation, model="dnn-bn" if bn else "dnn",
                                    clients_per_round=3, device="cpu", seed=7, node_wait_timeout=0.0,
                                    lost_node_rounds=lost_node_rounds)
        self.initial = {k: v.numpy() for k, v in _model(bn).state_dict().items()}
        self.api, self.builtin = api, entry.builtin
        if api == "message":
            self.strategy = build_message_strategy(self.cfg, len(NODES))
        else:
            self.strategy = build_legacy_strategy(self.cfg, self.initial, len(NODES))
        self.arrays = ArrayRecord({k: torch.as_tensor(v) for k, v in self.initial.items()})
        self.params = getattr(self.strategy, "initial_parameters", None)

    def global_model(self) -> torch.Tensor | None:
        """The global model (Flower's strategies: the arrays they pass on), ``None`` for methods without one."""
        if self.builtin:
            return fb.flat(self.arrays.to_numpy_ndarrays() if self.api == "message" else parameters_to_ndarrays(self.params))
        return self.strategy.method.global_model()

    def configure(self, rnd: int, nodes: list[int]) -> list[Any]:
        """Round ``rnd``'s training instructions with ``nodes`` connected."""
        if self.api == "message":
            return list(self.strategy.configure_train(rnd, self.arrays, ConfigRecord({}), fb.FakeGrid(nodes, RANKS)))
        return self.strategy.configure_fit(rnd, self.params, fb.client_manager([str(n) for n in nodes], RANKS_BY_CID))

    def aggregate(self, rnd: int, sent: list[Any], fail: bool = False) -> tuple[Any, dict]:
        """The replies to ``sent`` (every one an error where ``fail``) aggregated: what ``aggregate_train`` /
        ``aggregate_fit`` returned."""
        if self.api == "message":
            arrays, metrics = self.strategy.aggregate_train(rnd, [fb.error_reply(m) if fail else self._reply(rnd, m) for m in sent])
            if arrays is not None:
                self.arrays = arrays
            return arrays, dict(metrics or {})
        results = []
        for proxy, ins in [] if fail else sent:
            arrays, n, extras = self._trained(rnd, int(proxy.cid), fb.flat(parameters_to_ndarrays(ins.parameters)), dict(ins.config))
            results.append((proxy, fb.fit_res(list(arrays.values()), n, extras)))
        params, metrics = self.strategy.aggregate_fit(rnd, results, [RuntimeError("client crashed")] * len(sent) if fail else [])
        if params is not None:
            self.params = params
        return params, dict(metrics)

    def train(self, rnd: int, nodes: list[int], fail: bool = False) -> tuple[Any, dict]:
        """Round ``rnd``'s training with ``nodes`` connected (``aggregate``)."""
        return self.aggregate(rnd, self.configure(rnd, nodes), fail)

    def evaluate(self, rnd: int, nodes: list[int], fail: bool = False) -> Any:
        """Round ``rnd``'s evaluation: what ``aggregate_evaluate`` returned."""
        if self.api == "message":
            sent = list(self.strategy.configure_evaluate(rnd, self.arrays, ConfigRecord({}), fb.FakeGrid(nodes, RANKS)))
            return self.strategy.aggregate_evaluate(rnd, [fb.error_reply(m) if fail else fb.eval_reply(m, 0.5, 10) for m in sent])
        ins = self.strategy.configure_evaluate(rnd, self.params, fb.client_manager([str(n) for n in nodes], RANKS_BY_CID))
        results = [] if fail else [(proxy, EvaluateRes(Status(Code.OK, ""), 1.0, 10, {"accuracy": 0.5})) for proxy, _ in ins]
        return self.strategy.aggregate_evaluate(rnd, results, [RuntimeError("client crashed")] * len(ins) if fail else [])

    def _reply(self, rnd: int, msg: Message) -> Message:
        arrays, n, extras = self._trained(rnd, msg.metadata.dst_node_id, fb.sent(msg), dict(msg.content["config"]))
        return fb.train_reply(msg, arrays, n, extras=extras or None)

    def _trained(self, rnd: int, node: int, sent: torch.Tensor, config: dict) -> tuple[dict[str, np.ndarray], int, dict]:
        """A node's fabricated reply: the sent model moved a little, its sample count and the method's extras
        (the same for the same round and node)."""
        g = torch.Generator().manual_seed(1000 * rnd + node)
        moved = sent + 0.01 * torch.randn(sent.shape, generator=g)
        arrays = {k: v.numpy().reshape(a.shape).astype(a.dtype)
                  for (k, a), v in zip(self.initial.items(), torch.split(moved, [a.size for a in self.initial.values()]))}
        if self.builtin:
            return arrays, 10 + node, {}
        extras: dict[str, Any] = {**self.strategy.method.example_extras(g), CLIENT_ALGORITHM: config[CLIENT_ALGORITHM]}
        return arrays, 10 + node, extras


def _sent_models(sent: list[Any]) -> list[tuple[int, torch.Tensor]]:
    """``(node, model)`` of each training instruction, in either API."""
    return [(m.metadata.dst_node_id, fb.sent(m)) if isinstance(m, Message) else (int(m[0].cid), fb.flat(parameters_to_ndarrays(m[1].parameters)))
            for m in sent]


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("entry", ENTRIES)
def test_a_round_whose_replies_all_fail_changes_nothing_and_the_next_round_trains(entry, api):
    """Every training and evaluation reply of round 2 an error: aggregation returns what Flower's FedAvg
    returns (nothing) or the global model unchanged, and leaves the server as the round's plan left it."""
    run = Run(entry, api)
    run.train(1, NODES)
    model = run.global_model()
    sent = run.configure(2, NODES)
    planned = copy.deepcopy(run)
    returned, metrics = run.aggregate(2, sent, fail=True)
    assert returned is None or torch.equal(fb.flat(_arrays(returned)), model)
    if not entry.builtin:
        assert (metrics["clients-accepted"], metrics["clients-failed"]) == (0, 3)
        _assert_same_state(run.strategy, planned.strategy)
    assert run.evaluate(2, NODES, fail=True) in (None, (None, {}))
    _, metrics = run.train(3, NODES)
    if not entry.builtin:
        assert metrics["clients-accepted"] == 3
    assert model is None or not torch.equal(run.global_model(), model)


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("entry", OURS)
def test_a_round_without_nodes_leaves_the_run_as_if_it_had_not_been(entry, api, caplog):
    """Nothing to sample: no instruction, nothing to aggregate, and the next round sends and keeps exactly
    what it would have without the empty round. (Flower's own strategies wait for nodes instead.)"""
    run = Run(entry, api, lost_node_rounds=0)  # nodes that leave are not lost: the same come back
    run.train(1, NODES)
    twin = copy.deepcopy(run)
    model = run.global_model()
    caplog.clear()
    returned, metrics = run.train(2, [])
    assert returned is None or torch.equal(fb.flat(_arrays(returned)), model)
    assert (metrics["clients-accepted"], metrics["clients-failed"]) == (0, 0)
    assert run.evaluate(2, []) in (None, (None, {}))
    step, noun = ("configure_train", "node") if api == "message" else ("configure_fit", "client")
    assert f"{step}: round 2: no {noun} trains (none connected); the round changes nothing" in _warnings(caplog)
    sent, expected = run.configure(3, NODES), twin.configure(3, NODES)
    for (node, model), (twin_node, twin_model) in zip(_sent_models(sent), _sent_models(expected), strict=True):
        assert node == twin_node and torch.equal(model, twin_model)
    run.aggregate(3, sent)
    twin.aggregate(3, expected)
    _assert_same_state(run.strategy, twin.strategy)


class Failing:
    """A ClientApp every message fails in (here: a mod its wrapper is missing for)."""

    def __call__(self, message: Message, context: Any) -> Message:
        raise RuntimeError("fixedclipping_mod needs the server's clipping wrapper")


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("entry", ENTRIES)
def test_an_app_whose_every_node_fails_runs_all_its_rounds(entry, api, caplog):
    """Flower's own loop, nodes that fail every message: in the Message API ours declare them lost after a
    round and go on with rounds that have no trainers (the legacy loop does not say which client failed, so
    its rounds' replies all fail), as Flower's FedAvg goes on with rounds whose replies all fail."""
    run = Run(entry, api, lost_node_rounds=1)
    grid = in_process_grid(Failing(), len(NODES), {}, node_ids=NODES)
    if api == "message":
        result = run.strategy.start(grid=grid, initial_arrays=run.arrays, num_rounds=2)
        assert result.evaluate_metrics_clientapp == {}
    else:
        history = start_grid(grid=grid, strategy=run.strategy, config=ServerConfig(num_rounds=2))
        assert history.metrics_distributed == {}
    if api == "message" and not entry.builtin:
        expected = "configure_train: round 2: no node trains (none connected besides the 5 nodes lost); the round changes nothing"
        assert expected in _warnings(caplog)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def _arrays(returned: Any) -> list[np.ndarray]:
    return returned.to_numpy_ndarrays() if isinstance(returned, ArrayRecord) else parameters_to_ndarrays(returned)
