"""Per-FedAvg (first order): the MAML step by hand, the one-step personalization on the training
split only, the server's instructions and FedAvg, one whole run."""

import copy

import fabricate as fb
import numpy as np
import pytest
import torch
from batching import LR as BATCH_LR
from batching import assert_together_is_one_by_one
from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict

import flower_pfl.methods.per_fedavg as pf
import strategies.message
from client_apps.app import Node
from client_apps.own_loop import algorithm_for
from flower_pfl.engine.batched import unbatched
from flower_pfl.engine.client_algorithm import CLIENT_ALGORITHM, LR, TrainData, train_locally
from flower_pfl.engine.evaluation import evaluate
from flower_pfl.engine.layout import flatten_module
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.engine.minibatches import MinibatchStream
from flower_pfl.engine.reply_checks import RawReply
from flower_pfl.experiment.config import ExperimentConfig
from flower_pfl.experiment.models import MLR, build_model
from flower_pfl.methods.per_fedavg import ADAPT, ALPHA, PerFedAvg, PerFedAvgClient, adapt_one_step

from .runs import assert_as_recorded

F = torch.nn.functional


def _data():
    x = torch.randn(48, 4, generator=torch.Generator().manual_seed(0))
    return x, (x[:, 1] > 0).long()


def test_first_order_step_by_hand():
    x, y = _data()
    torch.manual_seed(0)
    model = MLR(4, 2)
    ref = copy.deepcopy(model)
    result, extras = train_locally(PerFedAvgClient(model, {LR: 0.1, ALPHA: 0.3}), model, TrainData(x, y), steps=2, lr=0.1,
                                   batch_size=8, generator=torch.Generator().manual_seed(4))
    stream = MinibatchStream(48, 8, torch.Generator().manual_seed(4))
    losses = []
    for _ in range(2):
        d1, d2 = stream.next(), stream.next()  # two fresh minibatches per step
        start = [p.detach().clone() for p in ref.parameters()]
        loss = F.cross_entropy(ref(x[d1]), y[d1])
        losses.append(float(loss.detach()))
        g1 = torch.autograd.grad(loss, list(ref.parameters()))
        with torch.no_grad():
            for p, g in zip(ref.parameters(), g1):
                p -= 0.3 * g  # w_tmp = w − α ∇f(w; D)
        g2 = torch.autograd.grad(F.cross_entropy(ref(x[d2]), y[d2]), list(ref.parameters()))
        with torch.no_grad():
            for p, s, g in zip(ref.parameters(), start, g2):
                p.copy_(s - 0.1 * g)  # w ← w − β ∇f(w_tmp; D')
    for p, r in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(p, r, atol=1e-6)
    assert extras == {CLIENT_ALGORITHM: "per-fedavg"} and result.steps == 2 and result.loss == pytest.approx(sum(losses) / 2, abs=1e-6)


def test_adaptation_is_one_full_batch_gradient_step():
    x, y = _data()
    torch.manual_seed(2)
    model = MLR(4, 2)
    ref = copy.deepcopy(model)
    adapt_one_step(model, x, y, 0.05)
    grads = torch.autograd.grad(F.cross_entropy(ref(x), y), list(ref.parameters()))
    with torch.no_grad():
        for p, r, g in zip(model.parameters(), ref.parameters(), grads):
            assert torch.allclose(p, r - 0.05 * g, atol=1e-7) and g.abs().sum() > 0
    before = flatten_module(model)
    adapt_one_step(model, x[:0], y[:0], 0.05)  # no training data: no step
    assert torch.equal(before, flatten_module(model))


@pytest.mark.parametrize("name", ["dnn", "dnn-bn"])
def test_a_round_s_clients_train_together_as_one_by_one(name):
    """Each client's two minibatches per step from its own stream, the inner step α as the server sends it:
    the models (running statistics after both forward passes) and losses are the same both ways."""
    model = build_model(name, (6,), 3, seed=0)
    assert unbatched(PerFedAvgClient, model) is None
    config = {CLIENT_ALGORITHM: "per-fedavg", LR: BATCH_LR, **PerFedAvg(alpha=0.2).train_config(4)}
    assert_together_is_one_by_one(model, (6,), lambda m, i: PerFedAvgClient(m, config))


def test_the_client_algorithm_is_no_hook_on_a_users_loop_and_keeps_no_state():
    torch.manual_seed(0)
    model = MLR(4, 2)
    with pytest.raises(ValueError, match="ClientApp"):
        algorithm_for({LR: 0.1, CLIENT_ALGORITHM: "per-fedavg", ALPHA: 0.3}, model)
    state: dict = {}
    x, y = _data()
    train_locally(PerFedAvgClient(model, {LR: 0.1, ALPHA: 0.3}, state), model, TrainData(x, y), steps=2, lr=0.1, batch_size=8,
                  generator=torch.Generator().manual_seed(0))
    assert state == {}


# --- the server ----------------------------------------------------------------------------------

def _arrays(w: float) -> dict[str, np.ndarray]:
    return {"fc.weight": np.full((2, 3), w, np.float32), "fc.bias": np.zeros(2, np.float32)}


def test_server_sends_alpha_to_train_and_adapt_and_averages_by_samples():
    server = MethodServer(PerFedAvg(alpha=0.02), clients_per_round=2, seed=1)
    server.initialize(_arrays(0.0))
    plan = server.plan_training(1, [4, 5, 6])
    assert len(plan) == 2 and all(ins.config == {CLIENT_ALGORITHM: "per-fedavg", ALPHA: 0.02} for ins in plan)
    new = server.aggregate(1, [server.check(RawReply(i.client_id, list(_arrays(float(i.client_id)).values()), None, i.client_id, {}))
                               for i in plan])
    ids = [i.client_id for i in plan]
    assert torch.allclose(new[:6], torch.full((6,), sum(c * c for c in ids) / sum(ids)))  # FedAvg, weighted by samples
    evals = server.plan_evaluation(1, [4, 5, 6], 1.0)
    assert all(e.config == {CLIENT_ALGORITHM: "per-fedavg", ADAPT: 0.02} and torch.equal(e.model, new) for e in evals)


def test_message_strategy_sends_alpha_beside_the_outer_lr():
    fb.set_task_identity()
    grid = fb.FakeGrid([1, 2])
    strat = strategies.message.PerFedAvg(alpha=0.3, fraction_train=1.0, min_train_nodes=2, min_available_nodes=2)
    msgs = list(strat.configure_train(1, ArrayRecord({k: fb.Array(v) for k, v in _arrays(0.0).items()}),
                                      ConfigRecord({"lr": 0.1}), grid))
    assert all((m.content["config"][ALPHA], m.content["config"]["lr"]) == (0.3, 0.1) for m in msgs)
    new, _ = strat.aggregate_train(1, [fb.train_reply(m, _arrays(float(m.metadata.dst_node_id)), num_examples=10) for m in msgs])
    assert np.allclose(new["fc.weight"].numpy(), 1.5)
    assert all(m.content["config"][ADAPT] == 0.3 for m in strat.configure_evaluate(1, new, ConfigRecord(), grid))
    with pytest.raises(ValueError, match="alpha"):
        PerFedAvg(alpha=0.0)


# --- the package's ClientApp -----------------------------------------------------------------------

def _node(state: RecordDict, pid: int = 0) -> Node:
    return Node.from_context(Context(run_id=1, node_id=5, node_config={"partition-id": pid, "num-partitions": 4}, state=state,
                                     run_config=ExperimentConfig().to_run_config()))


def test_node_evaluates_after_one_step_on_the_training_split_only(monkeypatch):
    node = _node(RecordDict())
    received = copy.deepcopy(node.model)
    seen = []
    real = pf.adapt_one_step
    monkeypatch.setattr(pf, "adapt_one_step", lambda model, x, y, alpha: (seen.append((x, y, alpha)), real(model, x, y, alpha)))
    adapted = node.evaluate({CLIENT_ALGORITHM: "per-fedavg", ADAPT: 0.05})
    (x, y, alpha), = seen
    assert torch.equal(x, node.data.x_train) and torch.equal(y, node.data.y_train) and alpha == 0.05
    monkeypatch.undo()
    expected = copy.deepcopy(received)
    adapt_one_step(expected, node.data.x_train, node.data.y_train, 0.05)
    assert not torch.equal(flatten_module(received), flatten_module(expected))
    assert adapted["loss"] == pytest.approx(evaluate(expected, node.data.x_test, node.data.y_test).loss, abs=1e-6)
    node.model.load_state_dict(received.state_dict())
    assert node.evaluate({})["loss"] == pytest.approx(evaluate(received, node.data.x_test, node.data.y_test).loss, abs=1e-6)


# --- one whole run -------------------------------------------------------------------------------

def test_short_run_as_recorded_and_better_than_fedavg(short_runs):
    summary = short_runs("per-fedavg")
    assert_as_recorded("per-fedavg", summary)
    fedavg = short_runs("fedavg")
    assert summary["final_accuracy"] > fedavg["final_accuracy"]
