"""IGFL (Huang, Shang et al.): the AFL server aggregation (Algorithm 3) and the IGFL-C client algorithm
(Algorithm 2) by hand, the server algorithm driven with fabricated replies through both Flower
APIs and ``MethodServer``, the client algorithm in a user's own loop, and short whole runs of
``igfl``, ``igfl-c`` and ``igfl-s``."""

import json
import math

import fabricate as fb
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from floats import assert_same_math
from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict
from flwr.common import parameters_to_ndarrays

import strategies
import strategies.message
from client_apps.app import Node
from client_apps.own_loop import RecordState, algorithm_for
from flower_pfl.engine.client_algorithm import BATCH_SIZE, CLIENT_ALGORITHM, LOCAL_STEPS, LR, TrainData, train_locally
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.engine.minibatches import MinibatchStream
from flower_pfl.engine.reply_checks import RawReply, UpdateRejected
from flower_pfl.engine.wire import decode_flat, decode_vector, encode_vector
from flower_pfl.experiment.config import ExperimentConfig
from flower_pfl.experiment.models import MLR
from flower_pfl.methods.igfl import (
    ATTENTION_MODES,
    DELTA_STATE,
    GLOBAL_DELTA,
    IGFL,
    PARTICIPANTS,
    IGFLCorrection,
    afl_global_delta,
    corrected_step,
)
from flower_pfl.methods.registry import client_algorithm_for

from .runs import assert_as_recorded

D = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
LIKE = [torch.zeros(2, 3), torch.zeros(2)]  # fc.weight, fc.bias
DIM = 8


def _softmax(*scores):
    e = [math.exp(s) for s in scores]
    return [v / sum(e) for v in e]


# --- 1. the math, by hand -------------------------------------------------------------------------

def test_self_attention_by_hand():
    update, w = afl_global_delta(D, None, "self")
    a0, b0 = _softmax(4.0, 0.0)  # <d0, d0> = 4, <d0, d1> = 0
    a1, b1 = _softmax(0.0, 1.0)  # <d1, d0> = 0, <d1, d1> = 1
    assert torch.allclose(w, torch.tensor([[a0, b0], [a1, b1]]))
    expected = (torch.tensor([2 * a0, b0]) + torch.tensor([2 * a1, b1])) / 2
    assert torch.allclose(update, expected)


def test_global_attention_by_hand():
    update, w = afl_global_delta(D, None, "global")
    a = _softmax(2.0, 0.5)  # mean delta (1, 0.5): <(2,0), .> = 2, <(0,1), .> = 0.5
    assert torch.allclose(w, torch.tensor(a)) and torch.allclose(update, torch.tensor([2 * a[0], a[1]]))


def test_time_attention_by_hand():
    previous = torch.tensor([[1.0, 0.0], [0.0, 0.0]])  # client 1 takes part for the first time
    update, w = afl_global_delta(D, previous, "time")
    a, b = _softmax(2.0, 0.0)  # q_0 = (1, 0): <q_0, d0> = 2, <q_0, d1> = 0; q_1 = 0 gives a uniform row
    assert torch.allclose(w, torch.tensor([[a, b], [0.5, 0.5]]))
    assert torch.allclose(update, (torch.tensor([2 * a, b]) + torch.tensor([1.0, 0.5])) / 2)
    with pytest.raises(ValueError, match="previous deltas"):
        afl_global_delta(D, None, "time")
    with pytest.raises(ValueError, match="mode must be"):
        afl_global_delta(D, previous, "cosine")


@pytest.mark.parametrize("mode", ATTENTION_MODES)
def test_equal_deltas_reduce_to_fedavg(mode):
    deltas = torch.tensor([0.3, -1.2, 5.0]).expand(4, 3).clone()
    previous = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    update, _ = afl_global_delta(deltas, previous, mode)
    assert torch.allclose(update, deltas.mean(0))


@pytest.mark.parametrize("mode", ATTENTION_MODES)
def test_stable_for_huge_dot_products(mode):
    deltas = torch.randn(5, 1000, generator=torch.Generator().manual_seed(1)) * 1e4
    update, w = afl_global_delta(deltas, deltas.flip(0), mode)
    assert torch.isfinite(update).all() and torch.isfinite(w).all()
    assert torch.allclose(w.sum(-1), torch.ones(w.shape[:-1]))


def test_corrected_step_by_hand():
    """Δ_I = −η g; Δ_G = (Δ_I − Δw_i^r / T) / |S| + Δw_ps / T."""
    g, prev, glob = torch.tensor([1.0, -2.0]), torch.tensor([0.6, 0.0]), torch.tensor([0.0, 0.8])
    step = corrected_step(g, prev, glob, lr=0.1, steps=4, num_participants=2)
    d_i = torch.tensor([-0.1, 0.2])
    assert torch.allclose(step, d_i + (d_i - torch.tensor([0.15, 0.0])) / 2 + torch.tensor([0.0, 0.2]))


def test_vector_bytes_roundtrip():
    v = torch.arange(8, dtype=torch.float32)
    parts = decode_vector(encode_vector(v), LIKE)
    assert [tuple(p.shape) for p in parts] == [(2, 3), (2,)] and torch.equal(torch.cat([p.flatten() for p in parts]), v)


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 4, generator=g)
    return x, (x[:, 0] > 0).long()


def _flat(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def _config(model, *, lr=0.1, steps=6, participants=1, global_delta=None):
    dim = sum(p.numel() for p in model.parameters())
    glob = torch.zeros(dim) if global_delta is None else global_delta
    return {LR: lr, LOCAL_STEPS: steps, BATCH_SIZE: 8, CLIENT_ALGORITHM: "igfl", PARTICIPANTS: participants,
            GLOBAL_DELTA: encode_vector(glob)}


def test_single_client_zero_deltas_is_sgd_with_double_step():
    x, y = _data()
    torch.manual_seed(0)
    model = MLR(4, 2)
    ref = MLR(4, 2)
    ref.load_state_dict(model.state_dict())
    step = IGFLCorrection(model, _config(model), state={})
    train_locally(step, model, TrainData(x, y), steps=6, lr=0.1, batch_size=8, generator=torch.Generator().manual_seed(3))
    stream = MinibatchStream(40, 8, torch.Generator().manual_seed(3))
    for _ in range(6):
        idx = stream.next()
        grads = torch.autograd.grad(F.cross_entropy(ref(x[idx]), y[idx]), list(ref.parameters()))
        with torch.no_grad():
            for p, g in zip(ref.parameters(), grads):
                p -= 2 * 0.1 * g  # Δ_I + Δ_G = 2 Δ_I when |S| = 1 and the deltas are zero
    assert torch.allclose(_flat(model), _flat(ref), atol=1e-6)


def test_corrections_by_hand_without_gradient():
    """A loss with zero gradient: only the corrections act; after T steps w = w_0 − Δw_i^r / |S| + Δw_ps,
    and the kept delta is exactly that change."""
    x, y = _data()
    model = MLR(4, 2)
    start = _flat(model)
    state = {DELTA_STATE: [torch.full_like(p, 0.6) for p in model.parameters()]}
    config = _config(model, steps=5, participants=3, global_delta=torch.full_like(start, -0.2))
    step = IGFLCorrection(model, config, state, loss_fn=lambda out, _y: 0.0 * out.sum())
    train_locally(step, model, TrainData(x, y), steps=5, lr=0.1, batch_size=8, generator=torch.Generator())
    assert torch.allclose(_flat(model), start - 0.6 / 3 - 0.2, atol=1e-6)
    assert torch.allclose(torch.cat([t.flatten() for t in state[DELTA_STATE]]), torch.full_like(start, -0.6 / 3 - 0.2), atol=1e-6)


# --- 2. the server algorithm, with fabricated replies -------------------------------------------------

def _arrays(value: float, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"fc.weight": (value + rng.normal(size=(2, 3))).astype(np.float32), "fc.bias": np.full(2, value, np.float32)}


def _vec(arrays) -> torch.Tensor:
    values = arrays.values() if isinstance(arrays, dict) else arrays
    return torch.cat([torch.as_tensor(np.asarray(a)).flatten() for a in values])


@pytest.fixture
def _identity():
    fb.set_task_identity()


def test_method_server_igfl_c_averages_the_deltas_and_sends_them_next_round():
    server = MethodServer(IGFL(attention=None), clients_per_round=2, seed=0)
    init = _arrays(0.0)
    server.initialize(init)
    plan = server.plan_training(1, [10, 11, 12])
    assert len(plan) == 2 and [ins.client_id for ins in plan] == server.last_participants
    for ins in plan:
        assert ins.config[CLIENT_ALGORITHM] == "igfl" and ins.config[PARTICIPANTS] == 2
        assert torch.equal(decode_flat(ins.config[GLOBAL_DELTA], DIM), torch.zeros(DIM)) and torch.equal(ins.model, _vec(init))
    returned = {ins.client_id: _arrays(1.0 + i, seed=i) for i, ins in enumerate(plan)}
    replies = [server.check(RawReply(cid, list(a.values()), list(a), 10 * (i + 1), {}))
               for i, (cid, a) in enumerate(returned.items())]
    new = server.aggregate(1, replies)
    mean_delta = torch.stack([_vec(a) - _vec(init) for a in returned.values()]).mean(0)  # unweighted: sample counts ignored
    assert torch.allclose(new, _vec(init) + mean_delta, atol=1e-6)
    assert set(server.method.previous) == set(returned)  # every participant's delta, kept for time attention
    plan = server.plan_training(2, [10, 11, 12])
    assert all(torch.allclose(decode_flat(ins.config[GLOBAL_DELTA], DIM), mean_delta) for ins in plan)
    assert all(torch.equal(ins.model, new) for ins in plan)
    with pytest.raises(UpdateRejected, match="names"):
        server.check(RawReply(10, list(init.values()), ["w", "b"], 10, {}))


def test_igfl_s_sends_plain_sgd_clients_and_bad_attention_is_refused():
    plans = {}
    for correction in (False, True):
        server = MethodServer(IGFL(client_correction=correction), clients_per_round=1)
        server.initialize(_arrays(0.0))
        (plans[correction],) = server.plan_training(1, [1, 2])
    assert plans[False].config == {CLIENT_ALGORITHM: "sgd"}  # IGFL-S: no IGFL-C inputs
    assert plans[True].config[CLIENT_ALGORITHM] == "igfl" and plans[True].config[PARTICIPANTS] == 1
    assert client_algorithm_for({LR: 0.1, **plans[False].config}).__name__ == "ClientAlgorithm"  # the ClientApp runs plain local SGD
    assert client_algorithm_for({LR: 0.1, **plans[True].config}) is IGFLCorrection
    with pytest.raises(ValueError, match="attention"):
        IGFL(attention="cosine")


def test_message_igfl_round_by_hand(_identity):
    grid = fb.FakeGrid(range(3))
    strat = strategies.message.IGFL(attention="global", fraction_train=1.0, min_train_nodes=3, min_available_nodes=3)
    init = _arrays(0.0)
    arrays = ArrayRecord({k: fb.Array(v) for k, v in init.items()})
    msgs = list(strat.configure_train(1, arrays, ConfigRecord({"lr": 0.1}), grid))
    cfg = msgs[0].content["config"]
    assert cfg[CLIENT_ALGORITHM] == "igfl" and cfg["igfl-participants"] == 3 and cfg["lr"] == 0.1
    assert torch.equal(_vec(decode_vector(cfg["igfl-global-delta"], LIKE)), torch.zeros(DIM))
    models = {m.metadata.dst_node_id: _arrays(0.0, seed=0) | {"fc.bias": np.full(2, float(m.metadata.dst_node_id), np.float32)}
              for m in msgs}
    new, metrics = strat.aggregate_train(1, [fb.train_reply(m, models[m.metadata.dst_node_id]) for m in msgs])
    deltas = torch.stack([_vec(models[m.metadata.dst_node_id]) - _vec(init) for m in msgs])
    expected, _ = afl_global_delta(deltas, None, "global")
    assert metrics["clients-accepted"] == 3
    assert torch.allclose(_vec({k: v.numpy() for k, v in new.items()}), _vec(init) + expected, atol=1e-6)
    msgs = list(strat.configure_train(2, new, ConfigRecord({"lr": 0.1}), grid))  # Δw_ps goes out next round
    sent = decode_vector(msgs[0].content["config"]["igfl-global-delta"], LIKE)
    assert torch.allclose(_vec(sent), expected, atol=1e-6)


def test_message_igfl_rejects_bad_updates_and_keeps_the_global_model(_identity):
    grid = fb.FakeGrid(range(2))
    strat = strategies.message.IGFL(attention="self", fraction_train=1.0, min_train_nodes=2, min_available_nodes=2)
    init = _arrays(0.0)
    msgs = list(strat.configure_train(1, ArrayRecord({k: fb.Array(v) for k, v in init.items()}), ConfigRecord(), grid))
    bad = _arrays(1.0) | {"fc.bias": np.array([np.nan, 0.0], np.float32)}
    new, metrics = strat.aggregate_train(1, [fb.train_reply(m, bad) for m in msgs])
    assert metrics["clients-rejected"] == 2 and metrics["clients-accepted"] == 0
    assert torch.equal(_vec({k: v.numpy() for k, v in new.items()}), _vec(init))  # the global model is kept
    assert strat.method.previous == {} and torch.equal(strat.method.global_delta, torch.zeros(DIM))


def test_legacy_igfl_time_attention_round():
    cm = fb.client_manager(["1", "2"])
    init = _arrays(0.0)
    strat = strategies.IGFL(attention="time", client_correction=False, initial_parameters=init,
                            min_fit_clients=2, min_available_clients=2)
    ins = strat.configure_fit(1, strat.initial_parameters, cm)
    assert all(fi.config[CLIENT_ALGORITHM] == "sgd" and "igfl-participants" not in fi.config for _, fi in ins)  # IGFL-S
    returned = {"1": list(_arrays(1.0).values()), "2": list(_arrays(3.0, seed=1).values())}
    params, metrics = strat.aggregate_fit(1, [(p, fb.fit_res(returned[p.cid])) for p, _ in ins], [])
    deltas = torch.stack([_vec(returned[p.cid]) - _vec(init) for p, _ in ins])
    first = _vec(parameters_to_ndarrays(params))
    assert torch.allclose(first, _vec(init) + deltas.mean(0), atol=1e-5)  # no previous deltas yet: uniform rows
    assert set(strat.method.previous) == {1, 2}  # legacy client ids are the node ids
    ins = strat.configure_fit(2, params, cm)  # round 2: each client's query is its round-1 delta
    again = {"1": list(_arrays(0.5, seed=2).values()), "2": list(_arrays(-0.2, seed=3).values())}
    params, _ = strat.aggregate_fit(2, [(p, fb.fit_res(again[p.cid])) for p, _ in ins], [])
    order = [p.cid for p, _ in ins]
    previous = torch.stack([_vec(returned[c]) - _vec(init) for c in order])
    now = torch.stack([_vec(again[c]) - first for c in order])
    expected, w = afl_global_delta(now, previous, "time")
    assert not torch.allclose(w, torch.full((2, 2), 0.5))
    assert torch.allclose(_vec(parameters_to_ndarrays(params)), first + expected, atol=1e-4)


# --- 3. the client algorithm: the user's own loop, the ClientApp's node ----------------------------------

def _user_loop(model, config, state, x, y, seed):
    """What a user's ClientApp does with the hooks (client_apps.own_loop' docstring)."""
    step = algorithm_for(config, model, state, torch.optim.SGD(model.parameters(), lr=config[LR]))
    return fb.user_loop(model, step, x, y, lr=config[LR], batch_size=config[BATCH_SIZE], steps=config[LOCAL_STEPS], seed=seed)


def test_users_loop_matches_train_locally_over_two_rounds():
    x, y = _data()
    torch.manual_seed(1)
    ours, theirs = MLR(4, 2), MLR(4, 2)
    theirs.load_state_dict(ours.state_dict())
    ours_state, their_state = {}, {}
    for rnd, glob in enumerate([None, torch.linspace(-0.1, 0.1, 10)], start=1):
        config = _config(ours, steps=4, participants=3, global_delta=glob)
        before = _flat(ours)
        step = client_algorithm_for(config)(ours, config, ours_state)
        _, extras = train_locally(step, ours, TrainData(x, y), steps=4, lr=0.1, batch_size=8,
                                  generator=torch.Generator().manual_seed(rnd))
        assert extras == _user_loop(theirs, config, their_state, x, y, seed=rnd) == {CLIENT_ALGORITHM: "igfl"}
        assert_same_math(_flat(ours), _flat(theirs))
        kept = torch.cat([t.flatten() for t in ours_state[DELTA_STATE]])
        assert_same_math(kept, torch.cat([t.flatten() for t in their_state[DELTA_STATE]]))
        assert torch.allclose(kept, _flat(ours) - before, atol=1e-6)  # Δw_i^{r+1} = w^{r,T} − w_ps^r
        ours.load_state_dict(theirs.state_dict())  # the same received model next round


def test_client_algorithm_refuses_what_its_arithmetic_does_not_assume():
    x, y = _data()
    model = MLR(4, 2)
    config = _config(model, steps=3)
    with pytest.raises(ValueError, match="momentum"):
        algorithm_for(config, model, RecordDict(), torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    with pytest.raises(ValueError, match="lr = 0.1"):
        algorithm_for(config, model, RecordDict(), torch.optim.SGD(model.parameters(), lr=0.2))
    with pytest.raises(ValueError, match="context.state"):
        IGFLCorrection(model, config, None)
    with pytest.raises(ValueError, match="igfl-participants"):
        IGFLCorrection(model, {k: v for k, v in config.items() if k != PARTICIPANTS}, {})
    with pytest.raises(ValueError, match="local-steps = 3"):  # Δw_i^r / T and Δw_ps / T assume exactly T steps
        train_locally(IGFLCorrection(model, config, {}), model, TrainData(x, y), steps=2, lr=0.1, batch_size=8,
                      generator=torch.Generator())


def test_node_keeps_its_last_delta_in_state():
    state = RecordDict()
    context = Context(run_id=1, node_id=3, node_config={"partition-id": 0, "num-partitions": 4}, state=state,
                      run_config=ExperimentConfig().to_run_config())
    node = Node.from_context(context)
    received = [p.detach().clone() for p in node.model.parameters()]
    config = {"lr": 0.05, "local-steps": 3, "batch-size": 10, CLIENT_ALGORITHM: "igfl", "igfl-participants": 4,
              "igfl-global-delta": encode_vector(torch.zeros(sum(p.numel() for p in received))), "server-round": 1}
    node.fit(config)
    stored = RecordState(state)[DELTA_STATE]
    for s, p, r in zip(stored, node.model.parameters(), received):
        assert torch.allclose(s, p.detach() - r)  # Δw_i^{r+1} = w^{r,T} − w_ps^r
    again = Node.from_context(context)
    again.fit({**config, "server-round": 2})  # now with its previous delta from state
    assert not all(torch.equal(a, b) for a, b in zip(stored, RecordState(state)[DELTA_STATE]))


# --- 4. whole runs --------------------------------------------------------------------------------

@pytest.mark.parametrize("label", ["igfl", "igfl-c", "igfl-s"])
def test_short_run_as_recorded(label, short_runs):
    assert_as_recorded(label, short_runs(label))


def test_attention_changes_the_models_igfl_c_averages(short_runs):
    """IGFL's self-attention and IGFL-C's plain mean of the same kind of deltas give other global
    models (the clients evaluate different fingerprints), and only IGFL records attention weights."""
    fingerprints = {}
    for label in ("igfl", "igfl-c"):
        folder = short_runs(label)["folder"]
        rows = [json.loads(line) for line in (folder / "clients.jsonl").read_text().splitlines()]
        fingerprints[label] = {(r["round"], r["model-fingerprint"]) for r in rows}
    assert fingerprints["igfl"].isdisjoint(fingerprints["igfl-c"])
    assert (short_runs("igfl")["folder"] / "attention.npz").exists() and not (short_runs("igfl-c")["folder"] / "attention.npz").exists()
