"""SCAFFOLD, option II (Karimireddy et al. 2020): the corrected steps, the control-variate update
and the server update by hand, the server algorithm driven with fabricated replies through both
Flower APIs and ``MethodServer``, the client algorithm in a user's own loop and on the ClientApp,
and a short whole run."""

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
from client_apps.app import Node, train
from client_apps.own_loop import RecordState, algorithm_for
from flower_pfl.engine.client_algorithm import BATCH_SIZE, CLIENT_ALGORITHM, LOCAL_STEPS, LR, TrainData, train_locally
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.engine.minibatches import MinibatchStream
from flower_pfl.engine.reply_checks import RawReply, UpdateRejected
from flower_pfl.engine.wire import decode_flat, encode_vector
from flower_pfl.experiment.config import ExperimentConfig
from flower_pfl.experiment.models import MLR
from flower_pfl.methods.registry import client_algorithm_for
from flower_pfl.methods.scaffold import (
    CONTROL,
    CONTROL_DELTA,
    CONTROL_STATE,
    SCAFFOLD,
    ScaffoldCorrection,
    new_control,
    scaffold_server_update,
)

from .runs import assert_as_recorded

D = 8  # fc.weight (2, 3) + fc.bias (2)


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 3, generator=g)
    return x, (x[:, 1] > 0).long()


def _cat(tensors) -> torch.Tensor:
    return torch.cat([torch.as_tensor(np.asarray(t)).flatten() for t in tensors])


def _config(c: torch.Tensor, *, lr=0.1, steps=4, batch_size=8):
    return {LR: lr, LOCAL_STEPS: steps, BATCH_SIZE: batch_size, CLIENT_ALGORITHM: "scaffold", CONTROL: encode_vector(c)}


# --- 1. the math, by hand -------------------------------------------------------------------------

def test_steps_use_corrected_gradient_and_option_ii_update():
    x, y = _data()
    torch.manual_seed(0)
    model, ref = MLR(3, 2), MLR(3, 2)
    ref.load_state_dict(model.state_dict())
    start = [p.detach().clone() for p in model.parameters()]
    c = [torch.full_like(p, 0.05) for p in model.parameters()]
    ci = [torch.full_like(p, -0.02) for p in model.parameters()]
    state = {CONTROL_STATE: [t.clone() for t in ci]}
    step = ScaffoldCorrection(model, _config(_cat(c)), state)
    _, extras = train_locally(step, model, TrainData(x, y), steps=4, lr=0.1, batch_size=8,
                              generator=torch.Generator().manual_seed(5))
    stream = MinibatchStream(32, 8, torch.Generator().manual_seed(5))
    for _ in range(4):  # y <- y − lr (g + c − c_i), by hand
        idx = stream.next()
        grads = torch.autograd.grad(F.cross_entropy(ref(x[idx]), y[idx]), list(ref.parameters()))
        with torch.no_grad():
            for p, g, cg, cl in zip(ref.parameters(), grads, c, ci):
                p -= 0.1 * (g + cg - cl)
    for p, r in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(p, r, atol=1e-6)
    new_ci = state[CONTROL_STATE]
    for n, cl, cg, x0, p in zip(new_ci, ci, c, start, model.parameters()):
        assert torch.allclose(n, cl - cg + (x0 - p.detach()) / (4 * 0.1), atol=1e-5)  # option II
    assert torch.allclose(decode_flat(extras[CONTROL_DELTA], D), _cat(new_ci) - _cat(ci), atol=1e-6)  # Δc_i


def test_without_data_gradient_the_local_variate_resets():
    """Zero gradient: y = x − K η (c − c_i), so c_i^+ = c_i − c + (c − c_i) = 0."""
    model = torch.nn.Linear(3, 2, bias=False)
    x, y = torch.zeros(8, 3), torch.zeros(8, dtype=torch.long)
    state = {CONTROL_STATE: [torch.full((2, 3), -0.1)]}
    step = ScaffoldCorrection(model, _config(torch.full((6,), 0.3), lr=0.5, steps=3, batch_size=4), state)
    _, extras = train_locally(step, model, TrainData(x, y), steps=3, lr=0.5, batch_size=4, generator=torch.Generator())
    assert torch.allclose(state[CONTROL_STATE][0], torch.zeros(2, 3), atol=1e-6)
    assert torch.allclose(decode_flat(extras[CONTROL_DELTA], 6), torch.full((6,), 0.1), atol=1e-6)


def test_new_control_by_hand():
    new = new_control([torch.tensor([1.0])], [torch.tensor([0.5])], [torch.tensor([2.0])], [torch.tensor([1.0])], steps=4, lr=0.25)
    assert torch.allclose(new[0], torch.tensor([1.0 - 0.5 + (2.0 - 1.0) / (4 * 0.25)]))


def test_server_update_by_hand():
    x, c = torch.tensor([1.0, 1.0]), torch.tensor([0.0, 0.5])
    dy = torch.tensor([[0.2, 0.0], [0.4, -0.2]])
    dc = torch.tensor([[1.0, 1.0], [3.0, -1.0]])
    new_x, new_c = scaffold_server_update(x, c, dy, dc, num_clients=10, lr_global=0.5)
    assert torch.allclose(new_x, torch.tensor([1.0 + 0.5 * 0.3, 1.0 - 0.5 * 0.1]))
    assert torch.allclose(new_c, torch.tensor([0.0 + 0.2 * 2.0, 0.5 + 0.2 * 0.0]))


# --- 2. the server algorithm, with fabricated replies -------------------------------------------------

def _arrays(value: float) -> dict[str, np.ndarray]:
    return {"fc.weight": np.full((2, 3), value, np.float32), "fc.bias": np.full(2, value, np.float32)}


def _vec(arrays) -> torch.Tensor:
    return _cat(arrays.values() if isinstance(arrays, dict) else arrays)


def _dc(value: float) -> bytes:
    return encode_vector(torch.full((D,), value))


@pytest.fixture
def _identity():
    fb.set_task_identity()


def test_method_server_scaffold_round_by_hand():
    """N is every connected client, |S| the participants; sample counts do not weight."""
    server = MethodServer(SCAFFOLD(server_learning_rate=2.0), clients_per_round=2, seed=1)
    server.initialize(_arrays(1.0))
    plan = server.plan_training(1, [5, 6, 7, 8])
    assert len(plan) == 2 and all(torch.equal(decode_flat(ins.config[CONTROL], D), torch.zeros(D)) for ins in plan)
    assert all(ins.config[CLIENT_ALGORITHM] == "scaffold" for ins in plan)
    replies = [server.check(RawReply(ins.client_id, list(_arrays(1.0 + i).values()), None, 10 + 90 * i, {},
                                     {CONTROL_DELTA: _dc(2.0 * i + 1)})) for i, ins in enumerate(plan)]
    new = server.aggregate(1, replies)
    assert torch.allclose(new, torch.full((D,), 1.0 + 2.0 * 0.5))  # x + η_g mean Δy, Δy = 0, 1
    assert torch.allclose(server.method.control, torch.full((D,), 2 / 4 * 2.0))  # |S| / N · mean Δc, Δc = 1, 3
    assert all(torch.allclose(decode_flat(ins.config[CONTROL], D), server.method.control) for ins in server.plan_training(2, [5, 6, 7, 8]))
    with pytest.raises(UpdateRejected, match="scaffold-control-delta"):
        server.check(RawReply(5, list(_arrays(1.0).values()), None, 10, {}, {}))
    with pytest.raises(ValueError, match="server_learning_rate"):
        SCAFFOLD(server_learning_rate=0.0)


def test_message_scaffold_two_rounds_by_hand(_identity):
    """x += mean Δy; c += |S|/N mean Δc with N the connected nodes; c goes out next round."""
    grid = fb.FakeGrid(range(5))
    strat = strategies.message.SCAFFOLD(fraction_train=0.4, min_train_nodes=2, min_available_nodes=2)
    arrays = ArrayRecord({k: fb.Array(v) for k, v in _arrays(1.0).items()})
    msgs = list(strat.configure_train(1, arrays, ConfigRecord({"lr": 0.1}), grid))
    assert len(msgs) == 2
    assert torch.equal(decode_flat(msgs[0].content["config"]["scaffold-control"], D), torch.zeros(D))
    assert all(m.content["config"][CLIENT_ALGORITHM] == "scaffold" for m in msgs)
    replies = [fb.train_reply(m, _arrays(1.0 + i), extras={"scaffold-control-delta": _dc(3.0 * i + 1)})
               for i, m in enumerate(msgs)]  # Δy = 0, 1; Δc = 1, 4
    new, metrics = strat.aggregate_train(1, replies)
    assert metrics["clients-accepted"] == 2
    assert torch.allclose(_vec({k: v.numpy() for k, v in new.items()}), torch.full((D,), 1.5))
    msgs = list(strat.configure_train(2, new, ConfigRecord({"lr": 0.1}), grid))
    assert torch.allclose(decode_flat(msgs[0].content["config"]["scaffold-control"], D), torch.full((D,), 2 / 5 * 2.5))


@pytest.mark.parametrize("extras, reason", [(None, "lacks"), ({"scaffold-control-delta": b"\x00" * 12}, "expected 8"),
                                            ({"scaffold-control-delta": encode_vector(torch.full((D,), float("nan")))}, "NaN")])
def test_message_scaffold_rejects_a_bad_control_delta(extras, reason, caplog, _identity):
    grid = fb.FakeGrid(range(2))
    strat = strategies.message.SCAFFOLD(fraction_train=1.0, min_train_nodes=2, min_available_nodes=2)
    msgs = list(strat.configure_train(1, ArrayRecord({k: fb.Array(v) for k, v in _arrays(0.0).items()}), ConfigRecord(), grid))
    good = fb.train_reply(msgs[0], _arrays(2.0), extras={"scaffold-control-delta": _dc(1.0)})
    bad = fb.train_reply(msgs[1], _arrays(9.0), extras=extras)
    new, metrics = strat.aggregate_train(1, [good, bad])
    assert metrics["clients-accepted"] == 1 and metrics["clients-rejected"] == 1
    assert torch.allclose(_vec({k: v.numpy() for k, v in new.items()}), torch.full((D,), 2.0))  # only the good one
    assert torch.allclose(strat.method.control, torch.full((D,), 0.5))  # |S| / N = 1 / 2
    assert reason in caplog.text


def test_legacy_scaffold_round():
    cm = fb.client_manager(["1", "2", "3", "4"])
    strat = strategies.SCAFFOLD(initial_parameters=_arrays(0.0), fraction_fit=0.5,
                                min_fit_clients=2, min_available_clients=2, server_learning_rate=0.5)
    ins = strat.configure_fit(1, strat.initial_parameters, cm)
    assert len(ins) == 2 and all(len(fi.config["scaffold-control"]) == 4 * D and fi.config[CLIENT_ALGORITHM] == "scaffold"
                                 for _, fi in ins)
    res = [(p, fb.fit_res(list(_arrays(2.0 * (i + 1)).values()), extras={"scaffold-control-delta": _dc(i + 1.0)}))
           for i, (p, _) in enumerate(ins)]
    params, metrics = strat.aggregate_fit(1, res, [])
    assert torch.allclose(_vec(parameters_to_ndarrays(params)), torch.full((D,), 0.5 * 3.0))  # η_g mean Δy
    assert torch.allclose(strat.method.control, torch.full((D,), 2 / 4 * 1.5))
    assert "scaffold-control-delta" not in metrics  # bytes never reach the metrics


# --- 3. the client algorithm: the user's own loop, the ClientApp ---------------------------------------

def _user_loop(model, config, state, x, y, seed):
    """What a user's ClientApp does with the hooks (client_apps.own_loop' docstring)."""
    step = algorithm_for(config, model, state, torch.optim.SGD(model.parameters(), lr=config[LR]))
    return fb.user_loop(model, step, x, y, lr=config[LR], batch_size=config[BATCH_SIZE], steps=config[LOCAL_STEPS], seed=seed)


def test_users_loop_matches_train_locally_over_two_rounds():
    x, y = _data()
    torch.manual_seed(2)
    ours, theirs = MLR(3, 2), MLR(3, 2)
    theirs.load_state_dict(ours.state_dict())
    ours_state, their_state = {}, RecordDict()  # a plain dict, and context.state as on a SuperNode
    for rnd, c in enumerate([torch.zeros(D), torch.linspace(-0.2, 0.2, D)], start=1):
        config = _config(c, steps=3)
        step = client_algorithm_for(config)(ours, config, ours_state)
        assert isinstance(step, ScaffoldCorrection)
        before = [t.clone() for t in ours_state.get(CONTROL_STATE, [torch.zeros(2, 3), torch.zeros(2)])]
        _, extras = train_locally(step, ours, TrainData(x, y), steps=3, lr=0.1, batch_size=8,
                                  generator=torch.Generator().manual_seed(rnd))
        their_extras = _user_loop(theirs, config, their_state, x, y, seed=rnd)
        assert_same_math(_vec([p.detach() for p in ours.parameters()]), _vec([p.detach() for p in theirs.parameters()]))
        kept = _cat(ours_state[CONTROL_STATE])
        assert torch.allclose(kept, _cat(RecordState(their_state)[CONTROL_STATE]), atol=1e-5)
        assert torch.allclose(decode_flat(extras[CONTROL_DELTA], D), decode_flat(their_extras[CONTROL_DELTA], D), atol=1e-5)
        assert torch.allclose(decode_flat(extras[CONTROL_DELTA], D), kept - _cat(before), atol=1e-6)  # Δc_i = c_i^+ − c_i
        assert extras[CLIENT_ALGORITHM] == their_extras[CLIENT_ALGORITHM] == "scaffold"
        ours.load_state_dict(theirs.state_dict())


def test_node_keeps_its_control_variate_and_returns_the_change():
    state = RecordDict()
    context = Context(run_id=1, node_id=3, node_config={"partition-id": 0, "num-partitions": 4}, state=state,
                      run_config=ExperimentConfig().to_run_config())
    node = Node.from_context(context)
    dim = sum(p.numel() for p in node.model.parameters())
    config = {"lr": 0.05, "local-steps": 3, "batch-size": 10, "server-round": 1, CLIENT_ALGORITHM: "scaffold",
              "scaffold-control": encode_vector(torch.full((dim,), 0.1))}
    _, payload = node.fit(config)
    first = _cat(RecordState(state)[CONTROL_STATE])
    assert torch.allclose(decode_flat(payload["scaffold-control-delta"], dim), first)  # c_i was zero: Δc_i = c_i^+
    _, payload = Node.from_context(context).fit({**config, "server-round": 2})
    second = _cat(RecordState(state)[CONTROL_STATE])
    assert torch.allclose(decode_flat(payload["scaffold-control-delta"], dim), second - first, atol=1e-6)


def test_message_clientapp_reply_carries_the_control_delta(_identity):
    context = Context(run_id=1, node_id=3, node_config={"partition-id": 1, "num-partitions": 4}, state=RecordDict(),
                      run_config=ExperimentConfig().to_run_config())
    node = Node.from_context(context)
    dim = sum(p.numel() for p in node.model.parameters())
    arrays = ArrayRecord({k: fb.Array(v.numpy()) for k, v in node.model.state_dict().items()})
    config = ConfigRecord({"lr": 0.05, "local-steps": 2, "batch-size": 10, CLIENT_ALGORITHM: "scaffold",
                           "scaffold-control": encode_vector(torch.zeros(dim))})
    msg = fb.Message(RecordDict({"arrays": arrays, "config": config}), message_type="train", dst_node_id=3)
    reply = train(msg, context)
    delta = decode_flat(reply.content["payload"]["scaffold-control-delta"], dim)
    assert reply.content["payload"][CLIENT_ALGORITHM] == "scaffold"  # the receipt
    assert torch.allclose(delta, _cat(RecordState(context.state)[CONTROL_STATE]))  # c_i started at zero


# --- 4. a whole run -------------------------------------------------------------------------------

def test_short_run_as_recorded(short_runs):
    assert_as_recorded("scaffold", short_runs("scaffold"))
