"""APFL: Algorithm 1 by hand (two rounds from the kept state), α clipped to [0, 1], the server's
instructions and FedAvg, the mixture kept in the node's state and evaluated, one whole run."""

import copy

import fabricate as fb
import numpy as np
import pytest
import torch
from batching import BATCH, assert_together_is_one_by_one, clients, load
from batching import LR as BATCH_LR
from floats import assert_same_math
from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict

import strategies.message
from client_apps.app import Node
from client_apps.own_loop import RecordState, algorithm_for
from flower_pfl.engine.batched import unbatched
from flower_pfl.engine.client_algorithm import CLIENT_ALGORITHM, LR, TrainData, train_locally
from flower_pfl.engine.evaluation import evaluate
from flower_pfl.engine.layout import flatten_module, load_flat_
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.engine.minibatches import MinibatchStream
from flower_pfl.engine.reply_checks import RawReply
from flower_pfl.experiment.config import ExperimentConfig
from flower_pfl.experiment.models import MLR, build_model
from flower_pfl.methods.apfl import ALPHA_INIT, ALPHA_LR, APFL, PERSONAL_STATE, APFLClient, Mixture

from .runs import assert_as_recorded

F = torch.nn.functional


def _data():
    x = torch.randn(24, 3, generator=torch.Generator().manual_seed(0))
    return x, (x[:, 2] > 0).long()


def _models():
    torch.manual_seed(0)
    return MLR(3, 2), MLR(3, 2)


def _by_hand(w, v, alpha, x, y, batches, lr, alpha_lr):
    """Algorithm 1 per minibatch: w ← w − η∇f(w); with w before its step held fixed in the
    mixture, v ← v − η∇_v f(α v(x) + (1 − α) w(x)) and α ← clip(α − η_α ∂/∂α, 0, 1)."""
    for idx in batches:
        out_w = w(x[idx])
        g_w = torch.autograd.grad(F.cross_entropy(out_w, y[idx]), list(w.parameters()))
        a = torch.tensor(alpha, requires_grad=True)
        mixed = F.cross_entropy(a * v(x[idx]) + (1 - a) * out_w.detach(), y[idx])
        *g_v, g_a = torch.autograd.grad(mixed, [*v.parameters(), a])
        with torch.no_grad():
            for p, g in zip(w.parameters(), g_w):
                p -= lr * g
            for p, g in zip(v.parameters(), g_v):
                p -= lr * g
        alpha = min(1.0, max(0.0, alpha - alpha_lr * float(g_a)))
    return alpha


def _config(alpha_lr=0.5, alpha_init=0.4):
    return {CLIENT_ALGORITHM: "apfl", LR: 0.1, ALPHA_LR: alpha_lr, ALPHA_INIT: alpha_init}


def _train(model, state, config, steps, seed):
    x, y = _data()
    return train_locally(APFLClient(model, config, state), model, TrainData(x, y), steps=steps, lr=config[LR], batch_size=8,
                         generator=torch.Generator().manual_seed(seed))


def _personal(state, like):
    personal = copy.deepcopy(like)
    load_flat_(personal, state[PERSONAL_STATE][0])
    return personal, float(state[PERSONAL_STATE][1][0])


def test_one_step_by_hand():
    x, y = _data()
    w, v = _models()
    ref_w, ref_v = copy.deepcopy(w), copy.deepcopy(v)
    state = {PERSONAL_STATE: [flatten_module(v), torch.tensor([0.4])]}  # a personal model away from w, α = 0.4
    _, extras = _train(w, state, _config(alpha_init=0.9), steps=1, seed=1)  # alpha_init is for a first round only
    idx = MinibatchStream(24, 8, torch.Generator().manual_seed(1)).next()
    alpha = _by_hand(ref_w, ref_v, 0.4, x, y, [idx], lr=0.1, alpha_lr=0.5)
    personal, kept_alpha = _personal(state, v)
    assert extras == {CLIENT_ALGORITHM: "apfl"}  # the receipt only
    for p, r in zip(w.parameters(), ref_w.parameters()):
        assert torch.allclose(p, r, atol=1e-6)
    for p, r, start in zip(personal.parameters(), ref_v.parameters(), v.parameters()):
        assert torch.allclose(p, r, atol=1e-6) and not torch.allclose(p, start)
    assert abs(kept_alpha - alpha) < 1e-6 and kept_alpha != 0.4


def test_first_round_starts_from_the_received_model_and_the_second_from_the_kept_state():
    x, y = _data()
    w, _ = _models()
    ref_w, ref_v = copy.deepcopy(w), copy.deepcopy(w)  # the personal model starts as the first global model received
    state: dict = {}
    _train(w, state, _config(alpha_init=0.3), steps=3, seed=2)
    stream = MinibatchStream(24, 8, torch.Generator().manual_seed(2))
    alpha = _by_hand(ref_w, ref_v, 0.3, x, y, [stream.next() for _ in range(3)], lr=0.1, alpha_lr=0.5)
    personal, kept = _personal(state, w)
    assert abs(kept - alpha) < 1e-6
    assert all(torch.allclose(p, r, atol=1e-6) for p, r in zip(personal.parameters(), ref_v.parameters()))

    new_global = copy.deepcopy(w)  # round 2: a new global model; v and α continue from the state
    with torch.no_grad():
        for p in new_global.parameters():
            p.add_(0.25)
    ref_w = copy.deepcopy(new_global)
    _train(new_global, state, _config(alpha_init=0.3), steps=3, seed=5)
    stream = MinibatchStream(24, 8, torch.Generator().manual_seed(5))
    alpha = _by_hand(ref_w, ref_v, alpha, x, y, [stream.next() for _ in range(3)], lr=0.1, alpha_lr=0.5)
    personal, kept = _personal(state, w)
    assert abs(kept - alpha) < 1e-6
    assert all(torch.allclose(p, r, atol=1e-6) for p, r in zip(personal.parameters(), ref_v.parameters()))
    assert all(torch.allclose(p, r, atol=1e-6) for p, r in zip(new_global.parameters(), ref_w.parameters()))


def test_alpha_stays_in_the_unit_interval():
    for start in (0.0, 1.0):
        w, _ = _models()
        state: dict = {}
        _train(w, state, _config(alpha_lr=1e4, alpha_init=start), steps=5, seed=2)
        assert 0.0 <= _personal(state, w)[1] <= 1.0
    w, _ = _models()
    state = {}
    _train(w, state, _config(alpha_lr=0.0, alpha_init=0.7), steps=5, seed=2)
    assert abs(_personal(state, w)[1] - 0.7) < 1e-7  # alpha_lr = 0 keeps α fixed


@pytest.mark.parametrize("alpha_lr", [0.02, 1e4], ids=["default", "clipped"])
@pytest.mark.parametrize("name", ["dnn", "dnn-bn"])
def test_a_round_s_clients_train_together_as_one_by_one(name, alpha_lr):
    """A second round: each client continues from the personal model and α its first round left (the first
    client never trained: the received model and α's start); the models, losses, kept v and α are the same
    both ways (α_lr = 10⁴ drives α onto the clip)."""
    model = build_model(name, (6,), 3, seed=0)
    assert unbatched(APFLClient, model) is None
    config = {CLIENT_ALGORITHM: "apfl", LR: BATCH_LR, **APFL(alpha_lr=alpha_lr).train_config(4)}
    datas, starts = clients(model, (6,))
    firsts: list[dict] = [{} for _ in datas]
    for i in range(1, len(datas)):
        first = copy.deepcopy(model)
        load(first, starts[i])
        train_locally(APFLClient(first, config, firsts[i]), first, datas[i], steps=3, lr=BATCH_LR, batch_size=BATCH,
                      generator=torch.Generator().manual_seed(10 + i))
    made: list[dict] = []

    def make(m, i):
        made.append(dict(firsts[i]))
        return APFLClient(m, config, made[-1])

    assert_together_is_one_by_one(model, (6,), make)
    assert len(made) == 2 * len(datas)
    for alone, together in zip(made[:len(datas)], made[len(datas):]):
        for a, b in zip(alone[PERSONAL_STATE], together[PERSONAL_STATE]):
            assert_same_math(b, a)
    alphas = [float(kept[PERSONAL_STATE][1][0]) for kept in made[:len(datas)]]
    if alpha_lr > 1:
        assert set(alphas) <= {0.0, 1.0}  # every step's α lands on the clip
    else:
        assert len(set(alphas)) > 1 and all(0.0 < a < 1.0 for a in alphas)  # each client's own α


def test_the_client_algorithm_needs_state_and_is_no_hook_on_a_users_loop():
    w, _ = _models()
    with pytest.raises(ValueError, match="state"):
        APFLClient(w, _config())
    with pytest.raises(ValueError, match="ClientApp"):
        algorithm_for(_config(), w, RecordDict())
    with pytest.raises(ValueError, match="alpha"):
        APFLClient(w, _config(alpha_init=1.5), {})


# --- the server ----------------------------------------------------------------------------------

def _arrays(w: float) -> dict[str, np.ndarray]:
    return {"fc.weight": np.full((2, 3), w, np.float32), "fc.bias": np.zeros(2, np.float32)}


def test_server_sends_alpha_settings_and_averages_by_samples():
    server = MethodServer(APFL(alpha_init=0.2, alpha_lr=0.05), clients_per_round=2, seed=0)
    server.initialize(_arrays(0.0))
    plan = server.plan_training(1, [7, 8, 9])
    assert len(plan) == 2 and all(ins.config == {CLIENT_ALGORITHM: "apfl", ALPHA_LR: 0.05, ALPHA_INIT: 0.2} for ins in plan)
    assert all(torch.equal(ins.model, torch.zeros(8)) for ins in plan)  # everyone trains the global model
    replies = [server.check(RawReply(ins.client_id, list(_arrays(float(ins.client_id)).values()), None, ins.client_id, {}))
               for ins in plan]
    new = server.aggregate(1, replies)
    ids = [ins.client_id for ins in plan]
    assert torch.allclose(new[:6], torch.full((6,), sum(c * c for c in ids) / sum(ids)))  # FedAvg, weighted by samples
    evals = server.plan_evaluation(1, [7, 8, 9], 1.0)
    assert [e.client_id for e in evals] == [7, 8, 9]
    assert all(e.config == {CLIENT_ALGORITHM: "apfl"} and torch.equal(e.model, new) for e in evals)


def test_message_strategy_sends_the_settings_with_the_run_config():
    fb.set_task_identity()
    grid = fb.FakeGrid([1, 2])
    strat = strategies.message.APFL(alpha_lr=0.1, fraction_train=1.0, min_train_nodes=2, min_available_nodes=2)
    arrays = ArrayRecord({k: fb.Array(v) for k, v in _arrays(0.0).items()})
    msgs = list(strat.configure_train(3, arrays, ConfigRecord({"lr": 0.05}), grid))
    for m in msgs:
        config = m.content["config"]
        assert (config[ALPHA_LR], config[ALPHA_INIT], config["lr"], config["server-round"]) == (0.1, 0.5, 0.05, 3)
        assert config[CLIENT_ALGORITHM] == "apfl"
    new, _ = strat.aggregate_train(3, [fb.train_reply(m, _arrays(float(m.metadata.dst_node_id)), num_examples=10) for m in msgs])
    assert np.allclose(new["fc.weight"].numpy(), 1.5)
    assert all(m.content["config"][CLIENT_ALGORITHM] == "apfl" for m in strat.configure_evaluate(3, new, ConfigRecord(), grid))


def test_declared_ranges_are_checked():
    with pytest.raises(ValueError, match="alpha_init"):
        APFL(alpha_init=1.5)
    with pytest.raises(ValueError, match="alpha_lr"):
        strategies.message.APFL(alpha_lr=-0.1)


# --- the package's ClientApp -----------------------------------------------------------------------

def test_node_keeps_personal_model_and_alpha_and_evaluates_the_mixture():
    state = RecordDict()
    node = Node.from_context(Context(run_id=1, node_id=3, node_config={"partition-id": 0, "num-partitions": 4}, state=state,
                                     run_config=ExperimentConfig().to_run_config()))
    received = [t.clone() for t in node.model.state_dict().values()]
    plain = node.evaluate({})
    assert node.evaluate({CLIENT_ALGORITHM: "apfl"})["loss"] == pytest.approx(plain["loss"])  # before any round: the received model
    node.fit({CLIENT_ALGORITHM: "apfl", "lr": 0.05, "local-steps": 4, "batch-size": 10, "server-round": 1, ALPHA_LR: 0.1, ALPHA_INIT: 0.3})
    kept = RecordState(node.state)[PERSONAL_STATE]
    personal, alpha = _personal({PERSONAL_STATE: kept}, node.model)
    assert 0.0 <= alpha <= 1.0 and alpha != 0.3 and len(kept) == 2
    node.load(received)
    expected = evaluate(Mixture(personal, node.model, alpha), node.data.x_test, node.data.y_test)
    mixed = node.evaluate({CLIENT_ALGORITHM: "apfl"})
    assert mixed["loss"] == pytest.approx(expected.loss, abs=1e-6) and mixed["accuracy"] == pytest.approx(expected.accuracy)
    assert mixed["loss"] != pytest.approx(plain["loss"])
    assert node.evaluate({})["loss"] == pytest.approx(plain["loss"])  # without the algorithm's name: the received model


# --- one whole run -------------------------------------------------------------------------------

def test_short_run_as_recorded_and_better_than_fedavg(short_runs):
    summary = short_runs("apfl")
    assert_as_recorded("apfl", summary)
    fedavg = short_runs("fedavg")
    assert summary["final_accuracy"] > fedavg["final_accuracy"]
