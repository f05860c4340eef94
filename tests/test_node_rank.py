"""Reproducible sampling in users' own apps: both APIs' strategies learn each node's rank (its
``partition-id`` by default) from replies and, before a draw, from one question per node where the app
answers it (Message API: with ``rank_query``), so the same seed samples the same partitions whatever
node ids Flower gives; driven with fabricated grids, proxies and replies."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import fabricate as fb
import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord
from flwr.common import Code, EvaluateRes, Status

import strategies
import strategies.message
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.engine.server_algorithm import GlobalModelAlgorithm

PARTITIONS = [0, 1, 2, 3, 4, 5]
#: two runs' node ids for the same partitions: ordered by node id, the partitions come in other orders
RUNS = ([101, 102, 103, 104, 105, 106], [906, 17, 530, 44, 805, 3])
WARNS_UNRANKED = "not reported 'partition-id'"


@pytest.fixture(autouse=True)
def _identity():
    fb.set_task_identity()


@dataclass
class Recorded(GlobalModelAlgorithm):
    """FedAvg that records the order in which each round's replies reach it."""

    orders: list[list[Any]] = field(default_factory=list)

    def combine(self, replies):
        self.orders.append([r.client_id for r in replies])
        return super().combine(replies)


def _trained(node: int, pid: dict[int, int]) -> tuple[dict[str, np.ndarray], int]:
    """A node's trained model and sample count: its partition's (its node id's when it has none)."""
    who = pid.get(node, node)
    return fb.model_arrays(0.1 * who), 10 + who


def _arrays() -> ArrayRecord:
    return ArrayRecord({k: Array(v) for k, v in fb.model_arrays(0.0).items()})


def _warnings(caplog, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and text in r.getMessage()]


# ---------------------------------------------------------------- Message API

def _message(**options) -> strategies.message.MethodStrategy:
    return strategies.message.MethodStrategy(Recorded(), clients_per_round=3, min_available_nodes=1, seed=7,
                                                  fraction_evaluate=0.5, **options)


def _message_round(strategy, grid, rnd: int, pid: dict[int, int], report: bool = True) -> tuple[list[int], list[int]]:
    """One round (replies in reverse order of arrival); the nodes that trained and those that evaluated.
    ``report``: replies carry the node's partition-id."""
    arrays = _arrays()
    msgs = list(strategy.configure_train(rnd, arrays, ConfigRecord({}), grid))
    replies = [fb.train_reply(m, *_trained(m.metadata.dst_node_id, pid)) for m in reversed(msgs)]
    for reply in replies:
        if report:
            reply.content["metrics"]["partition-id"] = pid[reply.metadata.src_node_id]
    strategy.aggregate_train(rnd, replies)
    evals = list(strategy.configure_evaluate(rnd, arrays, ConfigRecord({}), grid))
    strategy.aggregate_evaluate(rnd, [fb.eval_reply(m, 0.5, 10) for m in evals])
    return [m.metadata.dst_node_id for m in msgs], [m.metadata.dst_node_id for m in evals]


def test_message_api_runs_with_other_node_ids_sample_the_same_partitions_via_the_query():
    seen = []
    for nodes in RUNS:
        pid = dict(zip(nodes, PARTITIONS))
        grid = fb.FakeGrid(nodes, answers={n: {"partition-id": p} for n, p in pid.items()})
        strategy = _message(rank_query=True)
        rounds = [_message_round(strategy, grid, rnd, pid) for rnd in (1, 2, 3)]
        assert grid.queried == [nodes[:1], nodes[1:]]  # every node asked once, before round 1's draw (one first)
        seen.append(([[pid[n] for n in train] for train, _ in rounds], [[pid[n] for n in ev] for _, ev in rounds],
                     [[pid[n] for n in order] for order in strategy.method.orders], strategy.method.global_model()))
    (train_a, eval_a, order_a, model_a), (train_b, eval_b, order_b, model_b) = seen
    assert train_a == train_b and eval_a == eval_b
    assert order_a == order_b and all(order == sorted(order) for order in order_a)  # aggregated in partition order
    assert np.array_equal(model_a.numpy(), model_b.numpy())


def test_without_ranks_the_same_seed_samples_by_node_id():
    """What the ranks fix: with ``rank_key=None`` the two runs sample other partitions (and nobody is asked)."""
    picked = []
    for nodes in RUNS:
        pid = dict(zip(nodes, PARTITIONS))
        grid = fb.FakeGrid(nodes, answers={n: {"partition-id": p} for n, p in pid.items()})
        strategy = _message(rank_key=None)
        picked.append([[pid[n] for n in _message_round(strategy, grid, rnd, pid)[0]] for rnd in (1, 2, 3)])
        assert grid.queried == []
    assert picked[0] != picked[1]


def test_ranks_learned_from_replies_order_aggregation_with_full_participation_without_a_query_or_warning(caplog):
    nodes = RUNS[1]
    pid = dict(zip(nodes, PARTITIONS))
    grid = fb.FakeGrid(nodes)
    strategy = strategies.message.MethodStrategy(Recorded(), clients_per_round=len(nodes), min_available_nodes=1)
    _message_round(strategy, grid, 1, pid)
    assert grid.queried == [] and not _warnings(caplog, WARNS_UNRANKED)  # no draw: nothing to ask, nothing to say
    assert [pid[n] for n in strategy.method.orders[0]] == PARTITIONS  # learned before the round was aggregated
    assert strategy.server.node_rank == pid


def test_by_default_nobody_is_asked_and_one_line_says_how_nodes_are_ranked(caplog):
    """A guest in an app whose ClientApp may have no query function sends it no query: ranks come from the
    replies that carry them, and one warning line says what happens until then and how to rank from the start."""
    nodes = RUNS[0]
    pid = dict(zip(nodes, PARTITIONS))
    for report in (False, True):
        caplog.clear()
        grid = fb.FakeGrid(nodes, answers={n: {"partition-id": p} for n, p in pid.items()})  # it could answer: not asked
        strategy = _message()
        for rnd in (1, 2, 3):
            _message_round(strategy, grid, rnd, pid, report=report)
        assert grid.queried == []
        (warning,) = _warnings(caplog, "partition-id")
        assert "\n" not in warning and "6 of 6 nodes have not reported 'partition-id'" in warning
        assert "until a reply of theirs carries it" in warning and "rank_query=True" in warning
        assert "does not answer" not in warning
        replied = {n for order in strategy.method.orders for n in order}
        assert strategy.server.node_rank == ({n: pid[n] for n in replied} if report else {})


def test_an_app_that_does_not_answer_the_query_is_asked_once_and_warned_about_once(caplog):
    """``rank_query`` with a ClientApp without @app.query(): one node is asked, once in the run, and one warning
    says what follows. When its replies carry partition-id, later draws use it."""
    nodes = RUNS[0]
    pid = dict(zip(nodes, PARTITIONS))
    for report in (False, True):
        caplog.clear()
        grid = fb.FakeGrid(nodes)  # every query is an error
        strategy = _message(rank_query=True)
        for rnd in (1, 2, 3):
            _message_round(strategy, grid, rnd, pid, report=report)
        assert grid.queried == [nodes[:1]]
        (warning,) = _warnings(caplog, WARNS_UNRANKED)
        assert "6 of 6 nodes have not reported 'partition-id'" in warning and "does not answer" in warning
        assert "until a reply of theirs carries it" in warning and "@app.query()" in warning
        replied = {n for order in strategy.method.orders for n in order}
        assert strategy.server.node_rank == ({n: pid[n] for n in replied} if report else {})


def test_a_node_whose_query_fails_is_unranked_the_run_goes_on_and_a_later_reply_ranks_it(caplog):
    nodes = RUNS[1]
    pid = dict(zip(nodes, PARTITIONS))
    grid = fb.FakeGrid(nodes + [77], answers={n: {"partition-id": p} for n, p in pid.items()})  # node 77: an error
    strategy = _message(rank_query=True)
    train, _ = _message_round(strategy, grid, 1, {**pid, 77: 6}, report=False)
    assert len(train) == 3 and strategy.server.node_rank == pid
    (warning,) = _warnings(caplog, WARNS_UNRANKED)
    assert "1 of 7 nodes has not reported" in warning and "until a reply of its carries it, draws order it by node id" in warning
    replied = set()
    for rnd in (2, 3, 4, 5):
        replied.update(*_message_round(strategy, grid, rnd, {**pid, 77: 6}))  # replies now say who they are
    assert grid.queried == [nodes[:1], nodes[1:] + [77]]  # node 77 was not asked again
    assert 77 in replied and strategy.server.node_rank[77] == 6


def test_the_package_apps_ranks_mean_no_query():
    """The ServerApp sets every node's rank from its own start-up query: the strategy asks nobody."""
    nodes = RUNS[1]
    grid = fb.FakeGrid(nodes)
    strategy = _message(rank_query=True)
    strategy.server.node_rank = dict(zip(nodes, PARTITIONS))
    _message_round(strategy, grid, 1, dict(zip(nodes, PARTITIONS)))
    assert grid.queried == []


def test_nodes_sharing_a_rank_are_warned_about_once_and_ordered_by_node_id(caplog):
    nodes = [50, 40, 30, 20, 10, 60]
    answers = {50: 0, 40: 0, 30: 1, 20: 1, 10: 2, 60: 3}
    grid = fb.FakeGrid(nodes, answers={n: {"partition-id": p} for n, p in answers.items()})
    strategy = _message(rank_query=True)
    _message_round(strategy, grid, 1, answers, report=False)
    (warning,) = _warnings(caplog, "both report")
    assert "partition-id = 0" in warning and "50" in warning and "40" in warning
    assert strategy.server.sampler.order(nodes) == [40, 50, 20, 30, 10, 60]


# ---------------------------------------------------------------- legacy API

def _legacy(**options) -> strategies.LegacyMethodStrategy:
    return strategies.LegacyMethodStrategy(Recorded(), initial_parameters=fb.model_arrays(0.0), clients_per_round=3,
                                          min_available_clients=1, seed=7, fraction_evaluate=0.5, **options)


def _legacy_round(strategy, cm, rnd: int, pid: dict[int, int], report: bool = True) -> tuple[list[int], list[int]]:
    fit = strategy.configure_fit(rnd, strategy.initial_parameters, cm)
    extras = lambda p: {"partition-id": pid[int(p.cid)]} if report else {}
    results = []
    for proxy, _ in reversed(fit):
        model, n = _trained(int(proxy.cid), pid)
        results.append((proxy, fb.fit_res(list(model.values()), n, extras=extras(proxy))))
    strategy.aggregate_fit(rnd, results, [])
    evals = strategy.configure_evaluate(rnd, strategy.initial_parameters, cm)
    strategy.aggregate_evaluate(rnd, [(p, EvaluateRes(Status(Code.OK, ""), 1.0, 10, {"accuracy": 0.5})) for p, _ in evals], [])
    return [int(p.cid) for p, _ in fit], [int(p.cid) for p, _ in evals]


def test_legacy_api_runs_with_other_node_ids_sample_the_same_partitions_via_get_properties():
    seen = []
    for nodes in RUNS:
        pid = dict(zip(nodes, PARTITIONS))
        cm = fb.client_manager([str(n) for n in nodes], properties={str(n): {"partition-id": p} for n, p in pid.items()})
        strategy = _legacy()
        rounds = [_legacy_round(strategy, cm, rnd, pid) for rnd in (1, 2, 3)]
        assert all(proxy.asked == 1 for proxy in cm.all().values())
        seen.append(([[pid[n] for n in train] for train, _ in rounds], [[pid[n] for n in ev] for _, ev in rounds],
                     [[pid[n] for n in order] for order in strategy.method.orders]))
    assert seen[0] == seen[1]
    assert all(order == sorted(order) for order in seen[0][2])
    assert seen[0][0] == _message_partitions()  # the twins draw alike


def _message_partitions() -> list[list[int]]:
    nodes = RUNS[0]
    pid = dict(zip(nodes, PARTITIONS))
    grid = fb.FakeGrid(nodes, answers={n: {"partition-id": p} for n, p in pid.items()})
    strategy = _message(rank_query=True)
    return [[pid[n] for n in _message_round(strategy, grid, rnd, pid)[0]] for rnd in (1, 2, 3)]


def test_legacy_clients_without_get_properties_or_failing_it_are_unranked_warned_once_and_ranked_by_replies(caplog):
    nodes = RUNS[1]
    pid = dict(zip(nodes, PARTITIONS))
    properties = {str(nodes[0]): ValueError("Message contains an Error (reason: Invalid message type)")}
    cm = fb.client_manager([str(n) for n in nodes], properties=properties)  # the others: NOT_IMPLEMENTED
    strategy = _legacy()
    assert len(_legacy_round(strategy, cm, 1, pid, report=False)[0]) == 3
    for rnd in (2, 3):
        _legacy_round(strategy, cm, rnd, pid)
    assert [proxy.asked for proxy in cm.all().values()] == [1, 0, 0, 0, 0, 0]  # the first did not answer: nobody else is asked
    (warning,) = _warnings(caplog, WARNS_UNRANKED)
    assert "6 of 6 nodes" in warning and "get_properties" in warning
    trained = {n for order in strategy.method.orders[1:] for n in order}
    assert trained and all(strategy.server.node_rank[n] == pid[n] for n in trained)  # learned from fit replies


def test_legacy_strategy_with_every_rank_set_asks_nobody():
    nodes = RUNS[0]
    cm = fb.client_manager([str(n) for n in nodes], properties={str(n): {"partition-id": 0} for n in nodes})
    strategy = _legacy()
    strategy.server.node_rank = dict(zip(nodes, PARTITIONS))
    _legacy_round(strategy, cm, 1, dict(zip(nodes, PARTITIONS)))
    assert all(proxy.asked == 0 for proxy in cm.all().values())


# ---------------------------------------------------------------- MethodServer.learn_rank

def test_a_rank_is_a_finite_integer_valued_number_and_a_node_keeps_its_first():
    server = MethodServer(Recorded(), 2, rank_key="partition-id")
    for node, value in ((1, 2.5), (2, math.nan), (3, math.inf), (4, True), (5, "3"), (6, [1]), (7, None)):
        assert server.learn_rank(node, value) is None
    assert server.node_rank == {}
    server.learn_rank(8, 3.0)
    server.learn_rank(9, np.int64(4))
    server.learn_rank(8, 5)
    assert server.node_rank == {8: 3, 9: 4} and all(type(r) is int for r in server.node_rank.values())


def test_evaluation_metrics_reach_the_aggregation_function_in_rank_order():
    seen = []

    def aggregate(records, key):
        seen.extend(r["metrics"]["partition-id"] for r in records)
        return MetricRecord({"accuracy": 0.5})

    nodes = RUNS[1]
    strategy = strategies.message.MethodStrategy(Recorded(), clients_per_round=6, min_available_nodes=1,
                                                      evaluate_metrics_aggr_fn=aggregate)
    msgs = list(strategy.configure_evaluate(1, _arrays(), ConfigRecord({}), fb.FakeGrid(nodes)))
    replies = []
    for m in msgs:
        reply = fb.eval_reply(m, 0.5, 10)
        reply.content["metrics"]["partition-id"] = PARTITIONS[nodes.index(m.metadata.dst_node_id)]
        replies.append(reply)
    strategy.aggregate_evaluate(1, replies)
    assert seen == PARTITIONS


# ---------------------------------------------------------------- users' own apps, in process

def _user_apps(log: list[tuple[int, int]]) -> tuple[Any, Any]:
    """A user's legacy ClientApp (a NumPyClient with ``get_properties``) and Message-API ClientApp (with
    ``@app.query()``); neither reports its partition-id in replies. ``log`` gets ``(round, partition)``
    per training."""
    from flwr.app import Message, RecordDict
    from flwr.client import NumPyClient
    from flwr.clientapp import ClientApp

    def trained(arrays: list[np.ndarray], pid: int, rnd: int) -> list[np.ndarray]:
        log.append((rnd, pid))
        return [a + 0.01 * (pid + 1) for a in arrays]

    class Client(NumPyClient):
        def __init__(self, pid: int) -> None:
            self.pid = pid

        def get_properties(self, config):
            return {"partition-id": self.pid}

        def fit(self, parameters, config):
            return trained(parameters, self.pid, int(config["server-round"])), 10 + self.pid, {}

        def evaluate(self, parameters, config):
            return 1.0, 10, {"accuracy": 0.5}

    legacy = ClientApp(client_fn=lambda context: Client(int(context.node_config["partition-id"])).to_client())
    message = ClientApp()

    @message.train()
    def train(msg, context):
        arrays = msg.content["arrays"]
        out = trained([a.numpy() for a in arrays.values()], int(context.node_config["partition-id"]),
                      int(msg.content["config"]["server-round"]))
        return Message(RecordDict({"arrays": ArrayRecord({k: Array(a) for k, a in zip(arrays.keys(), out)}),
                                   "metrics": MetricRecord({"num-examples": 10})}), reply_to=msg)

    @message.evaluate()
    def evaluate(msg, context):
        return Message(RecordDict({"metrics": MetricRecord({"accuracy": 0.5, "num-examples": 10})}), reply_to=msg)

    @message.query()
    def query(msg, context):
        return Message(RecordDict({"metrics": MetricRecord({"partition-id": int(context.node_config["partition-id"])})}),
                       reply_to=msg)

    return legacy, message


@pytest.mark.parametrize("api", ["legacy", "message"])
def test_a_users_own_app_samples_the_same_partitions_whatever_the_node_ids(api, caplog):
    """Flower's legacy proxies (``get_properties``) and the Message API's QUERY, through Flower's own loops."""
    from flwr.server import ServerConfig

    from client_apps.flower_internals import start_grid
    from server_apps.inprocess import InProcessGrid

    runs = []
    for nodes in RUNS:
        log: list[tuple[int, int]] = []
        legacy_app, message_app = _user_apps(log)
        if api == "legacy":
            grid = InProcessGrid(legacy_app, len(nodes), {}, node_ids=nodes)
            start_grid(grid=grid, strategy=_legacy(), config=ServerConfig(num_rounds=3))  # type: ignore[arg-type]
        else:
            grid = InProcessGrid(message_app, len(nodes), {}, node_ids=nodes)
            _message(rank_query=True).start(grid=grid, initial_arrays=_arrays(), num_rounds=3)  # type: ignore[arg-type]
        runs.append(sorted(log))
    assert runs[0] == runs[1] and len(runs[0]) == 9
    assert not _warnings(caplog, WARNS_UNRANKED)
