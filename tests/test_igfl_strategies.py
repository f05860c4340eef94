"""IGFL's strategies (both APIs) and its client step, driven without Ray."""

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict
from flwr.common import parameters_to_ndarrays

import fabricate as fb
import strategies
import strategies.message
from client_apps.app import IGFL_STATE, Node
from flower_pfl.config import ExperimentConfig
from flower_pfl.methods.igfl import afl_global_delta
from flower_pfl.wire import decode_vector, encode_vector

NAMES = ("fc.weight", "fc.bias")


def _arrays(value: float, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"fc.weight": (value + rng.normal(size=(2, 3))).astype(np.float32), "fc.bias": np.full(2, value, np.float32)}


def _flat(arrays) -> torch.Tensor:
    return torch.cat([torch.as_tensor(np.asarray(a)).flatten() for a in (arrays.values() if isinstance(arrays, dict) else arrays)])


@pytest.fixture(autouse=True)
def _identity():
    fb.set_task_identity()


def test_vector_bytes_roundtrip():
    like = [torch.zeros(2, 3), torch.zeros(2)]
    v = torch.arange(8, dtype=torch.float32)
    parts = decode_vector(encode_vector(v), like)
    assert [tuple(p.shape) for p in parts] == [(2, 3), (2,)] and torch.equal(torch.cat([p.flatten() for p in parts]), v)


def test_message_igfl_round_by_hand():
    grid = fb.FakeGrid(range(3))
    strat = strategies.message.IGFL(attention="global", fraction_train=1.0, min_train_nodes=3, min_available_nodes=3)
    init = _arrays(0.0)
    arrays = ArrayRecord({k: fb.Array(v) for k, v in init.items()})
    msgs = list(strat.configure_train(1, arrays, ConfigRecord({"lr": 0.1}), grid))
    cfg = msgs[0].content["config"]
    assert cfg["igfl-correction"] is True and cfg["igfl-participants"] == 3
    assert torch.equal(_flat(decode_vector(cfg["igfl-global-delta"], [torch.zeros(2, 3), torch.zeros(2)])), torch.zeros(8))
    models = {m.metadata.dst_node_id: _arrays(0.0, seed=0) | {"fc.bias": np.full(2, float(m.metadata.dst_node_id), np.float32)}
              for m in msgs}
    new, metrics = strat.aggregate_train(1, [fb.train_reply(m, models[m.metadata.dst_node_id]) for m in msgs])
    deltas = torch.stack([_flat(models[m.metadata.dst_node_id]) - _flat(init) for m in msgs])
    expected, _ = afl_global_delta(deltas, None, "global")
    assert metrics["clients-accepted"] == 3
    assert torch.allclose(_flat({k: v.numpy() for k, v in new.items()}), _flat(init) + expected, atol=1e-6)
    msgs = list(strat.configure_train(2, new, ConfigRecord({"lr": 0.1}), grid))  # Δw_ps goes out next round
    sent = decode_vector(msgs[0].content["config"]["igfl-global-delta"], [torch.zeros(2, 3), torch.zeros(2)])
    assert torch.allclose(_flat(sent), expected, atol=1e-6)


def test_message_igfl_rejects_bad_updates_and_keeps_the_global_model():
    grid = fb.FakeGrid(range(2))
    strat = strategies.message.IGFL(attention="self", fraction_train=1.0, min_train_nodes=2, min_available_nodes=2)
    arrays = ArrayRecord({k: fb.Array(v) for k, v in _arrays(0.0).items()})
    msgs = list(strat.configure_train(1, arrays, ConfigRecord(), grid))
    bad = _arrays(1.0) | {"fc.bias": np.array([np.nan, 0.0], np.float32)}
    new, metrics = strat.aggregate_train(1, [fb.train_reply(m, bad) for m in msgs])
    assert new is None and metrics["clients-rejected"] == 2  # start() keeps the previous global model


def test_legacy_igfl_time_attention_round():
    cm = fb.client_manager(["a", "b"])
    init = list(_arrays(0.0).values())
    strat = strategies.IGFL(attention="time", client_correction=False, initial_parameters=fb.parameters(init),
                            min_fit_clients=2, min_available_clients=2)
    ins = strat.configure_fit(1, strat.initial_parameters, cm)
    assert all(fi.config["igfl-correction"] is False and fi.config["igfl-participants"] == 2 for _, fi in ins)
    returned = {"a": list(_arrays(1.0).values()), "b": list(_arrays(3.0, seed=1).values())}
    params, metrics = strat.aggregate_fit(1, [(p, fb.fit_res(returned[p.cid])) for p, _ in ins], [])
    deltas = torch.stack([_flat(returned[p.cid]) - _flat(init) for p, _ in ins])
    first = _flat(parameters_to_ndarrays(params))
    assert torch.allclose(first, _flat(init) + deltas.mean(0), atol=1e-5)  # no previous deltas yet: uniform rows
    assert set(strat.server.previous) == {"a", "b"}
    ins = strat.configure_fit(2, params, cm)  # round 2: each client's query is its round-1 delta
    again = {"a": list(_arrays(0.5, seed=2).values()), "b": list(_arrays(-0.2, seed=3).values())}
    params, _ = strat.aggregate_fit(2, [(p, fb.fit_res(again[p.cid])) for p, _ in ins], [])
    order = [p.cid for p, _ in ins]
    previous = torch.stack([_flat(returned[c]) - _flat(init) for c in order])
    now = torch.stack([_flat(again[c]) - first for c in order])
    expected, w = afl_global_delta(now, previous, "time")
    assert not torch.allclose(w, torch.full((2, 2), 0.5))
    assert torch.allclose(_flat(parameters_to_ndarrays(params)), first + expected, atol=1e-4)


def test_client_keeps_its_last_delta_in_state():
    state = RecordDict()
    context = Context(run_id=1, node_id=3, node_config={"partition-id": 0, "num-partitions": 4}, state=state,
                      run_config=ExperimentConfig().to_run_config())
    node = Node.from_context(context)
    received = [p.detach().clone() for p in node.model.parameters()]
    config = {"lr": 0.05, "local-steps": 3, "batch-size": 10, "igfl-correction": True, "igfl-participants": 4,
              "igfl-global-delta": encode_vector(torch.zeros(sum(p.numel() for p in received))), "server-round": 1}
    node.fit(config)
    stored = [torch.as_tensor(a) for a in state[IGFL_STATE].to_numpy_ndarrays()]
    for s, p, r in zip(stored, node.model.parameters(), received):
        assert torch.allclose(s, p.detach() - r)  # Δw_i^{r+1} = w^{r,T} - w_ps^r
    again = Node.from_context(context)
    again.fit({**config, "server-round": 2})  # now with its previous delta from state
    assert not all(torch.equal(a, torch.as_tensor(b)) for a, b in zip(stored, state[IGFL_STATE].to_numpy_ndarrays()))
