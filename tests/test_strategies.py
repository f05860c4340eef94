"""Both strategy classes driven with fabricated client results (no Ray, no SuperLink)."""

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord
from flwr.common import parameters_to_ndarrays

import fabricate as fb
import strategies
import strategies.message
from flower_pfl.attention import layerwise_attention

NAMES = ("fc.weight", "fc.bias")
SHAPES = ((2, 3), (2,))


def _arrays(value: float) -> dict[str, np.ndarray]:
    """A distinct model per value; different values give non-parallel vectors (cos < 1)."""
    return {n: np.full(s, value, np.float32) + np.arange(np.prod(s), dtype=np.float32).reshape(s)
            for n, s in zip(NAMES, SHAPES)}


def _flat(arrays) -> torch.Tensor:
    values = arrays.values() if isinstance(arrays, dict) else arrays
    return torch.cat([torch.as_tensor(np.asarray(a)).flatten() for a in values])


@pytest.fixture(autouse=True)
def _identity():
    fb.set_task_identity()


# ---------------------------------------------------------------- Message API

def _message_strategy(sigma=50.0, lam=5.0, k=3, seed=0, all_clients_train=False):
    return strategies.message.FedMCSA(sigma=sigma, lam=lam, clients_per_round=k, min_available_nodes=1, seed=seed,
                                      all_clients_train=all_clients_train)


def _run_round(strategy, grid, rnd, make_reply):
    msgs = list(strategy.configure_train(rnd, ArrayRecord({n: fb.Array(a) for n, a in _arrays(0.0).items()}),
                                         ConfigRecord({"lr": 0.1, "local-steps": 2, "batch-size": 4}), grid))
    replies = [make_reply(m) for m in msgs]
    return msgs, strategy.aggregate_train(rnd, replies)


def test_message_each_client_gets_its_own_personalized_model_and_settings():
    grid = fb.FakeGrid(range(10, 16))
    strat = _message_strategy(sigma=50.0, lam=2.5, k=4)
    # every node trains to a distinct model (value = node id)
    for rnd in (1, 2, 3):
        _run_round(strat, grid, rnd, lambda m: fb.train_reply(m, _arrays(float(m.metadata.dst_node_id))))
    msgs = list(strat.configure_train(4, ArrayRecord(), ConfigRecord({"lr": 0.1}), grid))
    ids = [m.metadata.dst_node_id for m in msgs]
    assert len(ids) == 4 == len(set(ids)) and set(ids) <= set(grid.node_ids)
    stored = strat.server.stored_models(ids)
    expected, _ = layerwise_attention(stored, strat.server.layout.component_slices("tensor"), 50.0)
    for i, msg in enumerate(msgs):
        got = _flat({k: v.numpy() for k, v in msg.content["arrays"].items()})
        assert torch.allclose(got, expected[i])
        assert list(msg.content["arrays"].keys()) == list(NAMES)
        cfg = msg.content["config"]
        assert cfg["proximal-mu"] == 2.5 and cfg["lr"] == 0.1 and cfg["server-round"] == 4


def test_message_all_clients_train_as_algorithm_1():
    """Sampled clients get the attention output and set their anchor; the others continue from
    their own stored model and keep their anchor; every reply updates the store."""
    grid = fb.FakeGrid(range(10, 16))
    strat = _message_strategy(sigma=50.0, k=2, all_clients_train=True)
    msgs, (_, metrics) = _run_round(strat, grid, 1, lambda m: fb.train_reply(m, _arrays(float(m.metadata.dst_node_id))))
    assert sorted(m.metadata.dst_node_id for m in msgs) == list(grid.node_ids) and metrics["clients-accepted"] == 6
    msgs = list(strat.configure_train(2, ArrayRecord(), ConfigRecord(), grid))
    sampled = [m.metadata.dst_node_id for m in msgs if m.content["config"]["anchor"] == "set"]
    others = [m for m in msgs if m.content["config"]["anchor"] == "keep"]
    assert len(sampled) == 2 and len(others) == 4
    expected, _ = layerwise_attention(strat.server.stored_models(sampled), strat.server.layout.component_slices("tensor"), 50.0)
    for m in msgs:
        got = _flat({k: v.numpy() for k, v in m.content["arrays"].items()})
        nid = m.metadata.dst_node_id
        want = expected[sampled.index(nid)] if nid in sampled else _flat(_arrays(float(nid)))
        assert torch.allclose(got, want, atol=1e-5)
        assert m.content["config"]["proximal-mu"] == 5.0


def test_message_large_sigma_sends_each_client_its_own_model_back():
    grid = fb.FakeGrid(range(4))
    strat = _message_strategy(sigma=1e6, k=4)
    _run_round(strat, grid, 1, lambda m: fb.train_reply(m, _arrays(1.0 + m.metadata.dst_node_id)))
    for msg in strat.configure_train(2, ArrayRecord(), ConfigRecord(), grid):
        own = _flat(_arrays(1.0 + msg.metadata.dst_node_id))
        assert torch.allclose(_flat({k: v.numpy() for k, v in msg.content["arrays"].items()}), own, atol=1e-5)


def test_message_store_updates_only_participants():
    grid = fb.FakeGrid(range(6))
    strat = _message_strategy(k=2)
    msgs, (arrays, metrics) = _run_round(strat, grid, 1, lambda m: fb.train_reply(m, _arrays(7.0)))
    assert arrays is None and metrics["clients-accepted"] == 2
    trained = {m.metadata.dst_node_id for m in msgs}
    for node in grid.node_ids:
        row = strat.server.stored_models([node])[0]
        assert torch.allclose(row, _flat(_arrays(7.0 if node in trained else 0.0)))


@pytest.mark.parametrize("bad", ["shape", "dtype", "nan", "inf", "names", "error", "missing-count"])
def test_message_bad_updates_are_rejected_without_damage(bad, caplog):
    grid = fb.FakeGrid(range(4))
    strat = _message_strategy(k=4)
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
        return msg

    _, (_, metrics) = _run_round(strat, grid, 2, reply)
    assert metrics["clients-accepted"] == 3
    assert metrics["clients-rejected" if bad != "error" else "clients-failed"] == 1
    assert torch.allclose(strat.server.stored_models([victim])[0], _flat(_arrays(1.0)))
    for node in (0, 1, 3):
        assert torch.allclose(strat.server.stored_models([node])[0], _flat(_arrays(3.0)))
    if bad != "error":
        assert f"client {victim} rejected" in caplog.text


def test_message_evaluation_sends_stored_models_and_aggregates_personalized_metrics():
    grid = fb.FakeGrid(range(3))
    strat = _message_strategy(k=3)
    _run_round(strat, grid, 1, lambda m: fb.train_reply(m, _arrays(float(m.metadata.dst_node_id))))
    msgs = list(strat.configure_evaluate(1, ArrayRecord(), ConfigRecord(), grid))
    assert sorted(m.metadata.dst_node_id for m in msgs) == [0, 1, 2]
    for m in msgs:
        got = _flat({k: v.numpy() for k, v in m.content["arrays"].items()})
        assert torch.allclose(got, _flat(_arrays(float(m.metadata.dst_node_id))))
    accs = {0: (1.0, 10), 1: (0.5, 30), 2: (0.0, 60)}
    metrics = strat.aggregate_evaluate(1, [fb.eval_reply(m, *accs[m.metadata.dst_node_id]) for m in msgs] +
                                       [fb.error_reply(msgs[0])])
    assert metrics["accuracy"] == pytest.approx(0.5)
    assert metrics["accuracy_weighted"] == pytest.approx(25 / 100)
    assert metrics["num_clients"] == 3


def test_message_sampling_is_seeded():
    grid = fb.FakeGrid(range(50))
    picks = []
    for _ in range(2):
        strat = _message_strategy(k=5, seed=7)
        picks.append([[m.metadata.dst_node_id for m in _run_round(strat, grid, r, lambda m: fb.train_reply(m, _arrays(1.0)))[0]]
                      for r in (1, 2)])
    assert picks[0] == picks[1] and picks[0][0] != picks[0][1]


def test_local_sends_each_client_its_own_model_and_no_proximal_term():
    grid = fb.FakeGrid(range(4))
    strat = strategies.message.Local(clients_per_round=4, min_available_nodes=1)
    _run_round(strat, grid, 1, lambda m: fb.train_reply(m, _arrays(1.0 + m.metadata.dst_node_id)))
    for msg in strat.configure_train(2, ArrayRecord(), ConfigRecord(), grid):
        assert torch.equal(_flat({k: v.numpy() for k, v in msg.content["arrays"].items()}),
                           _flat(_arrays(1.0 + msg.metadata.dst_node_id)))
        assert msg.content["config"]["proximal-mu"] == 0.0


# ---------------------------------------------------------------- legacy API

def _legacy_strategy(sigma=1e6, k=3, **kw):
    return strategies.FedMCSA(sigma=sigma, lam=5.0, initial_parameters=fb.parameters(list(_arrays(0.0).values())),
                              clients_per_round=k, min_available_clients=1,
                              on_fit_config_fn=lambda r: {"lr": 0.1, "local-steps": 3, "batch-size": 4}, **kw)


def test_legacy_right_model_to_right_client_and_store_updates():
    cm = fb.client_manager([str(i) for i in range(5)])
    strat = _legacy_strategy(k=5)
    assert strat.initialize_parameters(cm) is strat.initial_parameters
    ins = strat.configure_fit(1, strat.initial_parameters, cm)
    assert sorted(p.cid for p, _ in ins) == ["0", "1", "2", "3", "4"]
    assert all(fi.config["proximal-mu"] == 5.0 and fi.config["local-steps"] == 3 for _, fi in ins)
    results = [(p, fb.fit_res(list(_arrays(1.0 + int(p.cid)).values()))) for p, _ in ins]
    params, metrics = strat.aggregate_fit(1, results, [])
    assert params is None and metrics["clients-accepted"] == 5
    for proxy, fitins in strat.configure_fit(2, strat.initial_parameters, cm):  # sigma = 1e6: own model back
        assert torch.allclose(_flat(parameters_to_ndarrays(fitins.parameters)), _flat(_arrays(1.0 + int(proxy.cid))), atol=1e-5)
    for proxy, evalins in strat.configure_evaluate(2, strat.initial_parameters, cm):
        assert torch.allclose(_flat(parameters_to_ndarrays(evalins.parameters)), _flat(_arrays(1.0 + int(proxy.cid))))


def test_legacy_bad_updates_are_rejected_without_damage(caplog):
    cm = fb.client_manager(["a", "b", "c"])
    strat = _legacy_strategy(k=3)
    ins = strat.configure_fit(1, strat.initial_parameters, cm)
    good = list(_arrays(2.0).values())
    nan = [a.copy() for a in good]
    nan[0][0, 0] = np.nan
    by_cid = {"a": good, "b": nan, "c": [good[0].astype(np.float64), good[1]]}
    _, metrics = strat.aggregate_fit(1, [(p, fb.fit_res(by_cid[p.cid])) for p, _ in ins], [RuntimeError("lost")])
    assert metrics["clients-accepted"] == 1 and metrics["clients-rejected"] == 2 and metrics["clients-failed"] == 1
    assert torch.allclose(strat.server.stored_models(["a"])[0], _flat(good))
    for cid in ("b", "c"):
        assert torch.allclose(strat.server.stored_models([cid])[0], _flat(_arrays(0.0)))
    assert "client b rejected" in caplog.text and "NaN" in caplog.text and "float64" in caplog.text


def test_both_apis_compute_the_same_round():
    """Same seed, same results: the legacy and Message classes share all logic."""
    legacy = _legacy_strategy(sigma=3.0, k=2, seed=5, all_clients_train=True)
    message = _message_strategy(sigma=3.0, k=2, seed=5, all_clients_train=True)
    cm = fb.client_manager([str(i) for i in range(6)])
    grid = fb.FakeGrid(range(6))
    for rnd in (1, 2, 3):
        ins = legacy.configure_fit(rnd, legacy.initial_parameters, cm)
        msgs, _ = _run_round(message, grid, rnd, lambda m: fb.train_reply(m, _arrays(rnd + 0.1 * m.metadata.dst_node_id)))
        assert [int(p.cid) for p, _ in ins] == [m.metadata.dst_node_id for m in msgs] and len(msgs) == 6
        for (p, fi), m in zip(ins, msgs):
            assert fi.config["anchor"] == m.content["config"]["anchor"]
            assert torch.allclose(_flat(parameters_to_ndarrays(fi.parameters)),
                                  _flat({k: v.numpy() for k, v in m.content["arrays"].items()}))
        legacy.aggregate_fit(rnd, [(p, fb.fit_res(list(_arrays(rnd + 0.1 * int(p.cid)).values()))) for p, _ in ins], [])


def test_method_arguments_go_to_the_rule_and_bad_ones_are_refused():
    strat = strategies.message.FedMCSA(sigma=7.0, lam=0.5, grouping="module", clients_per_round=4)
    assert (strat.rule.sigma, strat.rule.lam, strat.rule.grouping, strat.server.clients_per_round) == (7.0, 0.5, "module", 4)
    with pytest.raises(TypeError, match="sigmaa"):
        strategies.message.FedMCSA(sigmaa=1.0)
    with pytest.raises(ValueError, match="sigma"):
        strategies.FedMCSA(sigma=-1.0, initial_parameters=fb.parameters(list(_arrays(0.0).values())))
    with pytest.raises(TypeError, match="not both"):
        strategies.message.Local(rule=strategies.message.FedMCSA().rule, all_clients_train=True)


def test_train_metrics_average_numbers_and_skip_the_rest():
    from strategies.metrics import weighted_train_metrics

    out = weighted_train_metrics([(10, {"train-loss": 1.0, "note": "ok", "blob": b"x", "flag": True}),
                                  (30, {"train-loss": 2.0, "note": "hi", "blob": b"y", "flag": False})])
    assert out == {"train-loss": 1.75}
