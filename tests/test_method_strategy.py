"""The plumbing every method shares (``MethodServer`` and both APIs' strategies), driven with
fabricated replies: sampling and node ranks, rejection of malformed updates, failures,
evaluation, all-clients-train anchors, global-model methods, and the generated constructors."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import fabricate as fb
import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord
from flwr.common import parameters_to_ndarrays

import strategies
import strategies.message
from flower_pfl.engine.client_algorithm import CLIENT_ALGORITHM
from flower_pfl.engine.layout import ParamLayout
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.engine.params import param_specs
from flower_pfl.engine.reply_checks import RawReply, UpdateRejected, check_update
from flower_pfl.engine.server_algorithm import GlobalModelAlgorithm, PersonalizedAlgorithm, weighted_mean
from flower_pfl.methods.all_clients_train import ANCHOR, ANCHOR_KEEP, ANCHOR_SET
from flower_pfl.methods.local import Local
from flower_pfl.methods.registry import method_classes

NAMES, SHAPES = fb.NAMES, fb.SHAPES
#: the personalized methods that offer FedMCSA's Algorithm 1 (every client trains every round)
ALL_CLIENTS_TRAIN = sorted((c for c in method_classes() if issubclass(c, PersonalizedAlgorithm)
                            and "all_clients_train" in {s.name for s in param_specs(c)}), key=lambda c: c.name)

_arrays, _flat, _sent = fb.model_arrays, fb.flat, fb.sent


@pytest.fixture(autouse=True)
def _identity():
    fb.set_task_identity()


def _message(cls=strategies.message.FedMCSA, k=3, seed=0, **kw):
    return cls(clients_per_round=k, min_available_nodes=1, seed=seed, **kw)


def _run_round(strategy, grid, rnd, make_reply):
    msgs = list(strategy.configure_train(rnd, ArrayRecord({n: fb.Array(a) for n, a in _arrays(0.0).items()}),
                                         ConfigRecord({"lr": 0.1, "local-steps": 2, "batch-size": 4}), grid))
    return msgs, strategy.aggregate_train(rnd, [make_reply(m) for m in msgs])


def _server(k=2, seed=0, **kw) -> MethodServer:
    server = MethodServer(Local(**kw), k, seed=seed)
    server.initialize(_arrays(0.0))
    return server


# ---------------------------------------------------------------- MethodServer

def test_method_server_checks_its_settings_and_needs_the_initial_model():
    with pytest.raises(ValueError, match="clients_per_round"):
        MethodServer(Local(), 0)
    with pytest.raises(ValueError, match="fraction_train"):
        MethodServer(Local(), None, fraction_train=0.0)
    server = MethodServer(Local(), 2)
    assert not server.initialized
    with pytest.raises(RuntimeError, match="initialize"):
        server.plan_training(1, [1, 2, 3])
    server.initialize(_arrays(0.0))
    server.initialize(_arrays(5.0))  # only the first call counts
    assert server.layout == ParamLayout.from_arrays(_arrays(0.0))
    assert torch.equal(server.method.store.get(["new"])[0], _flat(_arrays(0.0)))


def test_participants_by_number_or_fraction():
    assert len(_server(k=3).plan_training(1, range(10))) == 3
    assert len(_server(k=30).plan_training(1, range(10))) == 10  # never more than connected
    server = MethodServer(Local(), None, fraction_train=0.25, min_train_clients=2)
    server.initialize(_arrays(0.0))
    assert len(server.plan_training(1, range(10))) == 3  # ceil(2.5)
    assert len(server.plan_training(2, range(4))) == 2  # at least min_train_clients


def test_sampling_is_seeded_uniform_and_distinct():
    grid = fb.FakeGrid(range(50))
    picks = []
    for _ in range(2):
        strat = _message(k=5, seed=7)
        picks.append([[m.metadata.dst_node_id for m in _run_round(strat, grid, r, lambda m: fb.train_reply(m, _arrays(1.0)))[0]]
                      for r in (1, 2)])
    assert picks[0] == picks[1] and picks[0][0] != picks[0][1]
    assert all(len(set(p)) == 5 for p in picks[0])
    other = _message(k=5, seed=8)
    assert [m.metadata.dst_node_id for m in _run_round(other, grid, 1, lambda m: fb.train_reply(m, _arrays(1.0)))[0]] != picks[0][0]
    # over many rounds every client is drawn about equally often (k/n = 1/2 of the rounds)
    server = _server(k=5)
    counts = np.zeros(10)
    for rnd in range(400):
        for ins in server.plan_training(rnd, range(10)):
            counts[ins.client_id] += 1
    assert np.all(np.abs(counts / 400 - 0.5) < 0.1)


def test_node_ranks_make_the_sample_independent_of_node_ids():
    """Flower's node ids change from run to run; ranked by partition id, the same partitions train."""
    partitions = list(range(8))
    picked = []
    for ids in ([11, 12, 13, 14, 15, 16, 17, 18], [907, 3, 55, 1001, 42, 8, 700, 19]):
        server = _server(k=3, seed=4)
        server.node_rank = dict(zip(ids, partitions))
        rounds = []
        for rnd in (1, 2, 3):
            plan = server.plan_training(rnd, list(reversed(ids)))
            assert [i.client_id for i in plan] == server.last_participants
            rounds.append([server.node_rank[i.client_id] for i in plan])
        evaluation = server.plan_evaluation(3, ids, 1.0)
        assert [server.node_rank[i.client_id] for i in evaluation] == partitions  # ordered by rank
        picked.append(rounds)
    assert picked[0] == picked[1]
    assert all(r == sorted(r) for r in picked[0])
    unranked = _server(k=3, seed=4)
    assert [i.client_id for i in unranked.plan_training(1, [18, 12, 11])] == [11, 12, 18]  # then by id


# ---------------------------------------------------------------- checks of every reply

def test_check_update_accepts_the_layout_and_says_why_it_refuses():
    layout = ParamLayout.from_arrays(_arrays(0.0))
    good = list(_arrays(2.0).values())
    assert torch.equal(check_update(layout, good), _flat(good))
    assert torch.equal(check_update(layout, good, list(NAMES)), _flat(good))
    cases = {
        "names": (good, ["w", "b"]),
        "expected 2 arrays": (good[:1], None),
        "shape": ([good[0], np.zeros(3, np.float32)], None),
        "float64": ([good[0].astype(np.float64), good[1]], None),
        "NaN": ([good[0], np.array([np.nan, 0], np.float32)], None),
    }
    for reason, (arrays, names) in cases.items():
        with pytest.raises(UpdateRejected, match=reason):
            check_update(layout, arrays, names)
    with pytest.raises(UpdateRejected, match="Inf"):
        check_update(layout, [good[0], np.array([np.inf, 0], np.float32)])


@pytest.mark.parametrize("bad", ["shape", "dtype", "nan", "inf", "names", "error", "missing-count", "two-arrays"])
def test_message_bad_updates_are_rejected_without_damage(bad, caplog):
    grid = fb.FakeGrid(range(4))
    strat = _message(k=4)
    _run_round(strat, grid, 1, lambda m: fb.train_reply(m, _arrays(1.0)))  # everyone stores 1.0
    victim = 2

    def reply(m):
        if m.metadata.dst_node_id != victim:
            return fb.train_reply(m, _arrays(3.0))
        arrays = _arrays(3.0)
        if bad == "shape":
            arrays["fc.bias"] = np.zeros(3, np.float32)
        elif bad == "dtype":
            arrays["fc.bias"] = arrays["fc.bias"].astype(np.float64)
        elif bad == "nan":
            arrays["fc.weight"][0, 1] = np.nan
        elif bad == "inf":
            arrays["fc.bias"][1] = np.inf
        elif bad == "names":
            arrays = {"w": arrays["fc.weight"], "b": arrays["fc.bias"]}
        elif bad == "error":
            return fb.error_reply(m)
        msg = fb.train_reply(m, arrays)
        if bad == "missing-count":
            del next(iter(msg.content.metric_records.values()))["num-examples"]
        if bad == "two-arrays":
            msg.content["more"] = ArrayRecord({n: fb.Array(a) for n, a in _arrays(3.0).items()})
        return msg

    _, (_, metrics) = _run_round(strat, grid, 2, reply)
    assert metrics["clients-accepted"] == 3
    assert metrics["clients-rejected" if bad != "error" else "clients-failed"] == 1
    assert metrics["clients-failed" if bad != "error" else "clients-rejected"] == 0
    assert torch.equal(strat.method.store.get([victim])[0], _flat(_arrays(1.0)))
    for node in (0, 1, 3):
        assert torch.equal(strat.method.store.get([node])[0], _flat(_arrays(3.0)))
    if bad != "error":
        assert f"client {victim} rejected" in caplog.text


def test_legacy_bad_updates_and_failures_are_counted_without_damage(caplog):
    cm = fb.client_manager(["a", "b", "c"])
    strat = strategies.FedMCSA(sigma=1e6, initial_parameters=_arrays(0.0), clients_per_round=3, min_available_clients=1)
    ins = strat.configure_fit(1, strat.initial_parameters, cm)
    good = list(_arrays(2.0).values())
    nan = [a.copy() for a in good]
    nan[0][0, 0] = np.nan
    by_cid = {"a": good, "b": nan, "c": [good[0].astype(np.float64), good[1]]}
    _, metrics = strat.aggregate_fit(1, [(p, fb.fit_res(by_cid[p.cid])) for p, _ in ins], [RuntimeError("lost")])
    assert metrics["clients-accepted"] == 1 and metrics["clients-rejected"] == 2 and metrics["clients-failed"] == 1
    assert metrics["train-loss"] == pytest.approx(0.5)
    assert torch.equal(strat.method.store.get(["a"])[0], _flat(good))
    for cid in ("b", "c"):
        assert torch.equal(strat.method.store.get([cid])[0], _flat(_arrays(0.0)))
    assert "client b rejected" in caplog.text and "NaN" in caplog.text and "float64" in caplog.text


def test_a_round_where_every_reply_fails_changes_nothing():
    grid = fb.FakeGrid(range(3))
    strat = _message(k=3)
    _run_round(strat, grid, 1, lambda m: fb.train_reply(m, _arrays(1.0 + m.metadata.dst_node_id)))
    _, (arrays, metrics) = _run_round(strat, grid, 2, fb.error_reply)
    assert arrays is None and (metrics["clients-accepted"], metrics["clients-failed"]) == (0, 3)
    for node in range(3):
        assert torch.equal(strat.method.store.get([node])[0], _flat(_arrays(1.0 + node)))


@dataclass
class Picky(Local):
    """A user's own method: wants ``token`` back with every model (``check_extras``)."""

    name = "picky-test"  # not in the registry: defined outside flower_pfl.methods

    def check_extras(self, extras: Mapping[str, Any]) -> Any:
        if "token" not in extras:
            raise ValueError("the reply lacks 'token'")
        return extras["token"]


def test_a_methods_extras_check_rejects_replies_and_passes_what_it_made():
    server = MethodServer(Picky(), 2)
    server.initialize(_arrays(0.0))
    arrays = list(_arrays(1.0).values())
    reply = server.check(RawReply(5, arrays, list(NAMES), 12, {"train-loss": 1.0}, {"token": b"ok"}))
    assert (reply.client_id, reply.num_examples, reply.extras) == (5, 12, b"ok") and torch.equal(reply.model, _flat(arrays))
    with pytest.raises(UpdateRejected, match="token"):
        server.check(RawReply(5, arrays, list(NAMES), 12, {}, {}))

    grid = fb.FakeGrid(range(3))
    strat = strategies.message.MethodStrategy(Picky(), clients_per_round=3, min_available_nodes=1)
    _, (_, metrics) = _run_round(strat, grid, 1, lambda m: fb.train_reply(
        m, _arrays(2.0), extras={"token": b"x"} if m.metadata.dst_node_id != 1 else None))
    assert (metrics["clients-accepted"], metrics["clients-rejected"]) == (2, 1)
    assert torch.equal(strat.method.store.get([1])[0], _flat(_arrays(0.0)))


def test_train_metrics_average_numbers_and_skip_the_rest():
    from strategies.aggregated_metrics import weighted_train_metrics

    out = weighted_train_metrics([(10, {"train-loss": 1.0, "note": "ok", "blob": b"x", "flag": True}),
                                  (30, {"train-loss": 2.0, "note": "hi", "blob": b"y", "flag": False})])
    assert out == {"train-loss": 1.75}
    grid = fb.FakeGrid(range(2))
    strat = _message(k=2)
    _, (_, metrics) = _run_round(strat, grid, 1, lambda m: fb.train_reply(
        m, _arrays(1.0), num_examples=10 + 20 * m.metadata.dst_node_id, loss=1.0 + m.metadata.dst_node_id))
    assert metrics["train-loss"] == pytest.approx((10 * 1.0 + 30 * 2.0) / 40)


# ---------------------------------------------------------------- evaluation

def test_message_evaluation_sends_stored_models_and_aggregates_personalized_metrics():
    grid = fb.FakeGrid(range(3))
    strat = _message(k=3)
    _run_round(strat, grid, 1, lambda m: fb.train_reply(m, _arrays(float(m.metadata.dst_node_id))))
    msgs = list(strat.configure_evaluate(1, ArrayRecord(), ConfigRecord({"note": 1}), grid))
    assert sorted(m.metadata.dst_node_id for m in msgs) == [0, 1, 2]
    for m in msgs:
        assert torch.equal(_sent(m), _flat(_arrays(float(m.metadata.dst_node_id))))
        assert m.content["config"]["server-round"] == 1 and m.content["config"]["note"] == 1
    accs = {0: (1.0, 10), 1: (0.5, 30), 2: (0.0, 60)}
    metrics = strat.aggregate_evaluate(1, [fb.eval_reply(m, *accs[m.metadata.dst_node_id]) for m in msgs] +
                                       [fb.error_reply(msgs[0])])
    assert metrics["accuracy-mean"] == pytest.approx(0.5) and metrics["accuracy-min"] == 0.0
    assert metrics["accuracy"] == pytest.approx(25 / 100)  # Flower's sample-weighted mean, under the client's name
    assert metrics["accuracy-std"] == pytest.approx(np.std([1.0, 0.5, 0.0]))
    assert metrics["clients-evaluated"] == 3 and metrics["accuracy-bmta"] == pytest.approx(0.5)
    assert strat.aggregate_evaluate(1, [fb.error_reply(msgs[0])]) is None


def test_evaluation_fraction():
    grid = fb.FakeGrid(range(10))
    strat = _message(k=3, fraction_evaluate=0.25)
    _run_round(strat, grid, 1, lambda m: fb.train_reply(m, _arrays(1.0)))
    assert len(list(strat.configure_evaluate(1, ArrayRecord(), ConfigRecord(), grid))) == 3  # ceil(2.5)
    off = _message(k=3, fraction_evaluate=0.0)
    _run_round(off, grid, 1, lambda m: fb.train_reply(m, _arrays(1.0)))
    assert list(off.configure_evaluate(1, ArrayRecord(), ConfigRecord(), grid)) == []


def test_legacy_evaluation_sends_stored_models_and_aggregates_personalized_metrics():
    cm = fb.client_manager([str(i) for i in range(3)])
    strat = strategies.Local(initial_parameters=_arrays(0.0), clients_per_round=3, min_available_clients=1,
                             on_evaluate_config_fn=lambda r: {"round-note": r})
    ins = strat.configure_fit(1, strat.initial_parameters, cm)
    strat.aggregate_fit(1, [(p, fb.fit_res(list(_arrays(float(p.cid)).values()))) for p, _ in ins], [])
    evals = strat.configure_evaluate(1, strat.initial_parameters, cm)
    assert sorted(int(p.cid) for p, _ in evals) == [0, 1, 2]
    for proxy, evalins in evals:
        assert torch.equal(_flat(parameters_to_ndarrays(evalins.parameters)), _flat(_arrays(float(proxy.cid))))
        assert evalins.config["round-note"] == 1 and evalins.config["server-round"] == 1
    from flwr.common import Code, EvaluateRes, Status

    accs = {0: (1.0, 10), 1: (0.5, 30), 2: (0.0, 60)}
    results = [(p, EvaluateRes(Status(Code.OK, ""), 2.0, accs[int(p.cid)][1], {"accuracy": accs[int(p.cid)][0]}))
               for p, _ in evals]
    loss, metrics = strat.aggregate_evaluate(1, results, [RuntimeError("lost")])
    assert metrics["accuracy-mean"] == pytest.approx(0.5) and metrics["accuracy"] == pytest.approx(0.25)
    assert loss == pytest.approx(2.0)
    assert strat.aggregate_evaluate(1, [], []) == (None, {})
    assert strat.evaluate(1, strat.initial_parameters) is None
    quiet = strategies.Local(initial_parameters=_arrays(0.0), fraction_evaluate=0.0, min_available_clients=1)
    assert quiet.configure_evaluate(1, quiet.initial_parameters, cm) == []


# ---------------------------------------------------------------- all clients train (every personalized method)

def test_algorithm_1_is_offered_by_the_personalized_methods():
    assert {"fedmcsa", "fedacs", "fedamp", "heurfedamp", "local"} <= {c.name for c in ALL_CLIENTS_TRAIN}


@pytest.mark.parametrize("cls", ALL_CLIENTS_TRAIN, ids=lambda c: c.name)
def test_all_clients_train_anchors(cls):
    """The sampled clients get the method's models and set their anchor; every other connected
    client continues from its own stored model and keeps its anchor (FedMCSA's Algorithm 1)."""
    strat = getattr(strategies.message, cls.strategy)(clients_per_round=2, min_available_nodes=1, all_clients_train=True)
    grid = fb.FakeGrid(range(5))
    msgs, (_, metrics) = _run_round(strat, grid, 1, lambda m: fb.train_reply(m, _arrays(1.0 + m.metadata.dst_node_id)))
    assert len(msgs) == 5 and metrics["clients-accepted"] == 5
    msgs = list(strat.configure_train(2, ArrayRecord(), ConfigRecord(), grid))
    sampled = strat.server.last_participants
    assert len(sampled) == 2 and [m.metadata.dst_node_id for m in msgs[:2]] == sampled
    models, _ = strat.method.personalize(strat.method.store.get(sampled), strat.server.layout)
    for m in msgs:
        node, config = m.metadata.dst_node_id, m.content["config"]
        if node in sampled:
            assert config[ANCHOR] == ANCHOR_SET and torch.allclose(_sent(m), models[sampled.index(node)], atol=1e-6)
        else:
            assert config[ANCHOR] == ANCHOR_KEEP and torch.equal(_sent(m), _flat(_arrays(1.0 + node)))
        assert {k: v for k, v in config.items() if k != ANCHOR} == {**strat.method.train_config(1), "server-round": 2,
                                                                    CLIENT_ALGORITHM: strat.method.client_algorithm().name}
    without = getattr(strategies.message, cls.strategy)(clients_per_round=2, min_available_nodes=1)
    msgs, _ = _run_round(without, grid, 1, lambda m: fb.train_reply(m, _arrays(1.0)))
    assert len(msgs) == 2 and all(ANCHOR not in m.content["config"] for m in msgs)


# ---------------------------------------------------------------- both APIs

@pytest.mark.parametrize("cls", ALL_CLIENTS_TRAIN, ids=lambda c: c.name)
def test_both_apis_compute_the_same_rounds(cls):
    """Same seed, same results: the legacy and Message classes share all logic."""
    legacy = getattr(strategies, cls.strategy)(initial_parameters=_arrays(0.0), clients_per_round=2, min_available_clients=1,
                                               seed=5, all_clients_train=True)
    message = getattr(strategies.message, cls.strategy)(clients_per_round=2, min_available_nodes=1, seed=5,
                                                        all_clients_train=True)
    cm = fb.client_manager([str(i) for i in range(6)])
    grid = fb.FakeGrid(range(6))
    for rnd in (1, 2, 3):
        ins = legacy.configure_fit(rnd, legacy.initial_parameters, cm)
        msgs, _ = _run_round(message, grid, rnd, lambda m, r=rnd: fb.train_reply(m, _arrays(r + 0.1 * m.metadata.dst_node_id)))
        assert [int(p.cid) for p, _ in ins] == [m.metadata.dst_node_id for m in msgs] and len(msgs) == 6
        for (_, fi), m in zip(ins, msgs):
            assert {k: fi.config[k] for k in fi.config if k not in ("lr", "local-steps", "batch-size")} == \
                {k: v for k, v in m.content["config"].items() if k not in ("lr", "local-steps", "batch-size")}
            assert torch.allclose(_flat(parameters_to_ndarrays(fi.parameters)), _sent(m))
        legacy.aggregate_fit(rnd, [(p, fb.fit_res(list(_arrays(rnd + 0.1 * int(p.cid)).values()))) for p, _ in ins], [])
    assert torch.equal(legacy.method.store.get(list(range(6))), message.method.store.get(list(range(6))))


# ---------------------------------------------------------------- a global-model method

@dataclass
class Average(GlobalModelAlgorithm):
    """The default global-model step: FedAvg."""


def test_global_model_methods_return_the_new_model_from_accepted_replies_only():
    strat = strategies.message.MethodStrategy(Average(), clients_per_round=3, min_available_nodes=1)
    grid = fb.FakeGrid(range(3))

    def reply(m):
        node = m.metadata.dst_node_id
        if node == 2:
            bad = _arrays(100.0)
            bad["fc.bias"][0] = np.nan
            return fb.train_reply(m, bad)
        return fb.train_reply(m, _arrays(float(node)), num_examples=10 * (node + 1))

    msgs, (arrays, metrics) = _run_round(strat, grid, 1, reply)
    assert all(torch.equal(_sent(m), _flat(_arrays(0.0))) for m in msgs)
    want = weighted_mean(torch.stack([_flat(_arrays(0.0)), _flat(_arrays(1.0))]), [10, 20])
    assert torch.allclose(want, (_flat(_arrays(0.0)) + 2 * _flat(_arrays(1.0))) / 3)
    assert list(arrays.keys()) == list(NAMES) and torch.allclose(_flat({k: v.numpy() for k, v in arrays.items()}), want)
    assert metrics["clients-rejected"] == 1
    msgs = list(strat.configure_train(2, ArrayRecord(), ConfigRecord(), grid))
    assert all(torch.allclose(_sent(m), want) for m in msgs)  # everyone starts from the new global model
    assert all(torch.allclose(_sent(m), want) for m in strat.configure_evaluate(2, ArrayRecord(), ConfigRecord(), grid))

    legacy = strategies.LegacyMethodStrategy(Average(), initial_parameters=_arrays(0.0), clients_per_round=2,
                                            min_available_clients=1)
    cm = fb.client_manager(["0", "1"])
    ins = legacy.configure_fit(1, legacy.initial_parameters, cm)
    params, _ = legacy.aggregate_fit(1, [(p, fb.fit_res(list(_arrays(float(p.cid)).values()), num_examples=10 * (int(p.cid) + 1)))
                                         for p, _ in ins], [])
    assert torch.allclose(_flat(parameters_to_ndarrays(params)), want)


# ---------------------------------------------------------------- generated constructors

@pytest.mark.parametrize("cls", method_classes(), ids=lambda c: c.name)
def test_every_method_has_twin_strategies_with_its_parameters(cls):
    for module in (strategies, strategies.message):
        strat_cls = getattr(module, cls.strategy)
        assert strat_cls.method_class is cls
        doc = strat_cls.__doc__
        for spec in param_specs(cls):
            assert f"{spec.name} :" in doc
        with pytest.raises(TypeError, match="no_such_argument"):
            strat_cls(no_such_argument=1)


def test_legacy_initial_parameters_without_names_still_work():
    cm = fb.client_manager(["0", "1"])
    strat = strategies.Local(initial_parameters=fb.parameters(list(_arrays(0.0).values())), clients_per_round=2,
                             min_available_clients=1)
    assert strat.server.layout.shapes == SHAPES
    ins = strat.configure_fit(1, strat.initial_parameters, cm)
    assert all(torch.equal(_flat(parameters_to_ndarrays(fi.parameters)), _flat(_arrays(0.0))) for _, fi in ins)
    late = strategies.Local(clients_per_round=2, min_available_clients=1)  # no initial model: from configure_fit's
    assert late.initialize_parameters(cm) is None
    ins = late.configure_fit(1, fb.parameters(list(_arrays(3.0).values())), cm)
    assert all(torch.equal(_flat(parameters_to_ndarrays(fi.parameters)), _flat(_arrays(3.0))) for _, fi in ins)
