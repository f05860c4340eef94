"""Ditto: the client algorithm by hand (two rounds from the kept personal model), λ's pull toward the
global model, the server's instructions and FedAvg, the node's evaluation of its personal
model, one whole run."""

import copy

import fabricate as fb
import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict
from flwr.common import parameters_to_ndarrays

import strategies
import strategies.message
from client_apps.app import Node
from client_apps.own_loop import RecordState, algorithm_for
from flower_pfl.engine.client_algorithm import CLIENT_ALGORITHM, LR, PROXIMAL_MU, ClientAlgorithm, Proximal, TrainData, train_locally
from flower_pfl.engine.evaluation import evaluate
from flower_pfl.engine.layout import flatten_module
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.engine.minibatches import MinibatchStream
from flower_pfl.engine.reply_checks import RawReply
from flower_pfl.experiment.build import client_generator
from flower_pfl.experiment.config import ExperimentConfig
from flower_pfl.experiment.models import MLR
from flower_pfl.methods.ditto import LAMBDA, PERSONAL_STATE, Ditto, DittoClient

from .runs import assert_as_recorded

F = torch.nn.functional


def _data():
    x = torch.randn(48, 4, generator=torch.Generator().manual_seed(0))
    return x, (x[:, 1] > 0).long()


def _model(seed=1) -> MLR:
    torch.manual_seed(seed)
    return MLR(4, 2)


def _train(model, state, lam, steps, seed, lr=0.05):
    x, y = _data()
    return train_locally(DittoClient(model, {LR: lr, LAMBDA: lam}, state), model, TrainData(x, y), steps=steps, lr=lr,
                         batch_size=8, generator=torch.Generator().manual_seed(seed))


def _by_hand(w, v, x, y, batches, lam, lr):
    """Algorithm 1 per minibatch: w ← w − η∇f(w); v ← v − η(∇f(v) + λ(v − w_received))."""
    anchor = [p.detach().clone() for p in w.parameters()]
    for idx in batches:
        g_w = torch.autograd.grad(F.cross_entropy(w(x[idx]), y[idx]), list(w.parameters()))
        g_v = torch.autograd.grad(F.cross_entropy(v(x[idx]), y[idx]), list(v.parameters()))
        with torch.no_grad():
            for p, g in zip(w.parameters(), g_w):
                p -= lr * g
            for p, g, a in zip(v.parameters(), g_v, anchor):
                p -= lr * (g + lam * (p - a))


def _flat(model) -> torch.Tensor:
    return flatten_module(model)


def test_two_rounds_by_hand_from_the_kept_personal_model():
    x, y = _data()
    w = _model()
    ref_w, ref_v = copy.deepcopy(w), copy.deepcopy(w)  # v starts as the first global model received
    state: dict = {}
    _, extras = _train(w, state, lam=2.0, steps=3, seed=3)
    stream = MinibatchStream(48, 8, torch.Generator().manual_seed(3))
    _by_hand(ref_w, ref_v, x, y, [stream.next() for _ in range(3)], lam=2.0, lr=0.05)
    assert extras == {CLIENT_ALGORITHM: "ditto"}  # the receipt only
    assert torch.allclose(_flat(w), _flat(ref_w), atol=1e-6)
    assert torch.allclose(state[PERSONAL_STATE][0], _flat(ref_v), atol=1e-6)
    assert not torch.allclose(_flat(ref_v), _flat(ref_w), atol=1e-4)

    new_global = _model(seed=7)  # round 2: another global model; v continues from the state, pulled toward the new one
    ref_w = copy.deepcopy(new_global)
    _train(new_global, state, lam=2.0, steps=3, seed=4)
    stream = MinibatchStream(48, 8, torch.Generator().manual_seed(4))
    _by_hand(ref_w, ref_v, x, y, [stream.next() for _ in range(3)], lam=2.0, lr=0.05)
    assert torch.allclose(_flat(new_global), _flat(ref_w), atol=1e-6)
    assert torch.allclose(state[PERSONAL_STATE][0], _flat(ref_v), atol=1e-6)


def test_the_global_update_is_plain_local_sgd_and_the_personal_one_proximal_sgd():
    """The same as the package's other steps: ``ClientAlgorithm`` for w, ``Proximal`` toward the received w for v."""
    x, y = _data()
    w = _model()
    received = copy.deepcopy(w)
    state: dict = {}
    _train(w, state, lam=0.5, steps=6, seed=8)
    plain = copy.deepcopy(received)
    train_locally(ClientAlgorithm(plain, {}), plain, TrainData(x, y), steps=6, lr=0.05, batch_size=8,
                  generator=torch.Generator().manual_seed(8))
    prox = copy.deepcopy(received)
    train_locally(Proximal(prox, {PROXIMAL_MU: 0.5}), prox, TrainData(x, y), steps=6, lr=0.05, batch_size=8,
                  generator=torch.Generator().manual_seed(8))
    assert torch.allclose(_flat(w), _flat(plain), atol=1e-6)
    assert torch.allclose(state[PERSONAL_STATE][0], _flat(prox), atol=1e-6)


def test_dittos_regularizer_pulls_the_personal_model_toward_the_global_one():
    w = _model()
    received = _flat(w)

    def distance(lam: float) -> float:
        model = _model()
        state = {PERSONAL_STATE: [received + 1.0]}  # the personal model sits away from w
        _train(model, state, lam=lam, steps=10, seed=3)
        return float(((state[PERSONAL_STATE][0] - received) ** 2).sum())

    assert distance(5.0) < 0.5 * distance(0.0)


def test_the_client_algorithm_needs_state_and_is_no_hook_on_a_users_loop():
    w = _model()
    with pytest.raises(ValueError, match="state"):
        DittoClient(w, {LR: 0.1, LAMBDA: 1.0})
    with pytest.raises(ValueError, match="ClientApp"):
        algorithm_for({CLIENT_ALGORITHM: "ditto", LR: 0.1, LAMBDA: 1.0}, w, RecordDict())
    with pytest.raises(ValueError, match="lambda"):
        DittoClient(w, {LR: 0.1, LAMBDA: -1.0}, {})


# --- the server ----------------------------------------------------------------------------------

def _arrays(w: float) -> dict[str, np.ndarray]:
    return {"fc.weight": np.full((2, 3), w, np.float32), "fc.bias": np.zeros(2, np.float32)}


@pytest.fixture
def _identity():
    fb.set_task_identity()


def test_message_ditto_sends_lambda_to_train_and_names_its_algorithm_to_evaluate(_identity):
    grid = fb.FakeGrid([1, 2])
    strat = strategies.message.Ditto(lam=0.5, fraction_train=1.0, min_train_nodes=2, min_available_nodes=2)
    arrays = ArrayRecord({k: fb.Array(v) for k, v in _arrays(0.0).items()})
    msgs = list(strat.configure_train(1, arrays, ConfigRecord({"lr": 0.1}), grid))
    assert all(m.content["config"][LAMBDA] == 0.5 and m.content["config"][CLIENT_ALGORITHM] == "ditto" for m in msgs)
    replies = [fb.train_reply(m, _arrays(float(m.metadata.dst_node_id)), num_examples=10 * m.metadata.dst_node_id) for m in msgs]
    new, _ = strat.aggregate_train(1, replies)
    assert np.allclose(new["fc.weight"].numpy(), (1 * 10 + 2 * 20) / 30)  # FedAvg, weighted by samples
    assert torch.allclose(strat.method.model[:6], torch.full((6,), 50 / 30))
    evals = list(strat.configure_evaluate(1, new, ConfigRecord(), grid))
    assert all(dict(m.content["config"]) == {CLIENT_ALGORITHM: "ditto", "server-round": 1} for m in evals)  # the personal model
    assert all(np.allclose(m.content["arrays"]["fc.weight"].numpy(), 50 / 30) for m in evals)  # everyone gets the global model


def test_legacy_ditto_and_the_method_server_agree():
    cm = fb.client_manager(["1", "2", "3"])
    strat = strategies.Ditto(lam=2.0, clients_per_round=2, initial_parameters=_arrays(0.0), min_available_clients=3, seed=4)
    server = MethodServer(Ditto(lam=2.0), clients_per_round=2, seed=4)
    server.initialize(_arrays(0.0))
    ins = strat.configure_fit(1, strat.initial_parameters, cm)
    plan = server.plan_training(1, [1, 2, 3])
    assert sorted(int(p.cid) for p, _ in ins) == sorted(i.client_id for i in plan)  # the same seeded sample
    assert all(fit_ins.config[LAMBDA] == 2.0 and fit_ins.config["server-round"] == 1 for _, fit_ins in ins)
    assert all(fit_ins.config[CLIENT_ALGORITHM] == "ditto" for _, fit_ins in ins)
    params, _ = strat.aggregate_fit(1, [(p, fb.fit_res(list(_arrays(float(p.cid)).values()), num_examples=int(p.cid)))
                                        for p, _ in ins], [])
    new = server.aggregate(1, [server.check(RawReply(i.client_id, list(_arrays(float(i.client_id)).values()), None,
                                                     i.client_id, {})) for i in plan])
    assert np.allclose(np.concatenate([a.ravel() for a in parameters_to_ndarrays(params)]), new.numpy())
    assert all(e.config == {CLIENT_ALGORITHM: "ditto"} for e in server.plan_evaluation(1, [1, 2, 3], 1.0))


def test_declared_range_is_checked():
    with pytest.raises(ValueError, match="lam"):
        Ditto(lam=-1.0)


# --- the package's ClientApp -----------------------------------------------------------------------

def _node(state: RecordDict, pid: int = 0) -> Node:
    return Node.from_context(Context(run_id=1, node_id=5, node_config={"partition-id": pid, "num-partitions": 4}, state=state,
                                     run_config=ExperimentConfig().to_run_config()))


def test_node_keeps_a_personal_model_returns_plain_sgd_on_the_global_one_and_evaluates_the_personal_one():
    state = RecordDict()
    node = _node(state)
    received = {k: v.clone() for k, v in node.model.state_dict().items()}
    before = node.evaluate({CLIENT_ALGORITHM: "ditto"})
    assert before["loss"] == pytest.approx(node.evaluate({})["loss"])  # before any round: the received model
    config = {CLIENT_ALGORITHM: "ditto", "lr": 0.05, "local-steps": 4, "batch-size": 10, "server-round": 1, LAMBDA: 2.0}
    node.fit(config)
    returned = flatten_module(node.model)
    personal = RecordState(node.state)[PERSONAL_STATE][0]

    ref = copy.deepcopy(node.model)
    ref.load_state_dict(received)
    data = TrainData(node.data.x_train, node.data.y_train)
    train_locally(ClientAlgorithm(ref, config), ref, data, steps=4, lr=0.05, batch_size=10, generator=client_generator(0, 0, 1))
    assert torch.allclose(returned, flatten_module(ref), atol=1e-6)  # the global update is plain local SGD
    ref.load_state_dict(received)
    train_locally(Proximal(ref, {PROXIMAL_MU: 2.0}), ref, data, steps=4, lr=0.05, batch_size=10, generator=client_generator(0, 0, 1))
    assert torch.allclose(personal, flatten_module(ref), atol=1e-6)  # the personal one: proximal toward w

    node.load(list(received.values()))  # evaluation receives the global model and uses the personal one
    with_personal = node.evaluate({CLIENT_ALGORITHM: "ditto"})
    assert with_personal["loss"] == pytest.approx(evaluate(ref, node.data.x_test, node.data.y_test).loss)
    node.load(list(received.values()))
    assert node.evaluate({})["loss"] != pytest.approx(with_personal["loss"])  # without Ditto: the received model


# --- one whole run -------------------------------------------------------------------------------

def test_short_run_as_recorded_and_better_than_fedavg(short_runs):
    summary = short_runs("ditto")
    assert_as_recorded("ditto", summary)
    fedavg = short_runs("fedavg")
    assert summary["final_accuracy"] > fedavg["final_accuracy"]
