"""Ditto and Per-FedAvg: the client steps by hand, personal state, evaluation on test data only."""

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict

import fabricate as fb
import strategies.message
from client_apps.app import DITTO_STATE, Node
from flower_pfl.config import ExperimentConfig
from flower_pfl.layout import flatten_module
from flower_pfl.methods.per_fedavg import adapt_one_step, per_fedavg_local_sgd
from flower_pfl.models import MLR
from flower_pfl.solvers import MinibatchStream, local_sgd


def _data():
    x = torch.randn(48, 4, generator=torch.Generator().manual_seed(0))
    return x, (x[:, 1] > 0).long()


def test_per_fedavg_first_order_step_by_hand():
    x, y = _data()
    torch.manual_seed(0)
    model, ref = MLR(4, 2), MLR(4, 2)
    ref.load_state_dict(model.state_dict())
    per_fedavg_local_sgd(model, x, y, steps=2, alpha=0.3, beta=0.1, batch_size=8, generator=torch.Generator().manual_seed(4))
    stream = MinibatchStream(48, 8, torch.Generator().manual_seed(4))
    for _ in range(2):
        d1, d2 = stream.next(), stream.next()
        start = [p.detach().clone() for p in ref.parameters()]
        g1 = torch.autograd.grad(torch.nn.functional.cross_entropy(ref(x[d1]), y[d1]), list(ref.parameters()))
        with torch.no_grad():
            for p, g in zip(ref.parameters(), g1):
                p -= 0.3 * g  # w_tmp = w - alpha grad f(w; D)
        g2 = torch.autograd.grad(torch.nn.functional.cross_entropy(ref(x[d2]), y[d2]), list(ref.parameters()))
        with torch.no_grad():
            for p, s, g in zip(ref.parameters(), start, g2):
                p.copy_(s - 0.1 * g)  # w <- w - beta grad f(w_tmp; D')
    for p, r in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(p, r, atol=1e-6)


def _node(state: RecordDict, pid: int = 0) -> Node:
    return Node.from_context(Context(run_id=1, node_id=5, node_config={"partition-id": pid, "num-partitions": 4}, state=state,
                                     run_config=ExperimentConfig().to_run_config()))


def test_per_fedavg_evaluates_after_one_step_on_the_training_split_only(monkeypatch):
    import client_apps.app as capp

    node = _node(RecordDict())
    seen = []
    monkeypatch.setattr(capp, "adapt_one_step", lambda model, x, y, alpha: seen.append((x, y, alpha)))
    node.evaluate({"per-fedavg-adapt": 0.05})
    (x, y, alpha), = seen
    assert torch.equal(x, node.data.x_train) and torch.equal(y, node.data.y_train) and alpha == 0.05
    monkeypatch.undo()
    torch.manual_seed(0)
    model = MLR(60, 10)
    before = flatten_module(model)
    adapt_one_step(model, node.data.x_train, node.data.y_train, 0.05)
    assert not torch.equal(before, flatten_module(model))


def test_ditto_client_keeps_a_personal_model_and_returns_plain_sgd_on_the_global_one():
    state = RecordDict()
    node = _node(state)
    received = {k: v.clone() for k, v in node.model.state_dict().items()}
    config = {"lr": 0.05, "local-steps": 4, "batch-size": 10, "server-round": 1, "ditto-lambda": 2.0}
    node.fit(config)
    returned = flatten_module(node.model)
    personal = torch.as_tensor(state[DITTO_STATE].to_numpy_ndarrays()[0])

    ref = _node(RecordDict()).model
    ref.load_state_dict(received)
    from flower_pfl.experiment import client_generator

    local_sgd(ref, node.data.x_train, node.data.y_train, steps=4, lr=0.05, batch_size=10, generator=client_generator(0, 0, 1))
    assert torch.allclose(returned, flatten_module(ref), atol=1e-6)  # the global update is plain local SGD
    ref.load_state_dict(received)
    local_sgd(ref, node.data.x_train, node.data.y_train, steps=4, lr=0.05, batch_size=10, prox_mu=2.0,
              anchor=[p.detach().clone() for p in ref.parameters()], generator=client_generator(0, 0, 1))
    assert torch.allclose(personal, flatten_module(ref), atol=1e-6)  # the personal one: proximal toward w

    node.load(list(received.values()))  # evaluation receives the global model and uses the personal one
    with_personal = node.evaluate({"ditto-lambda": 2.0})
    from flower_pfl.solvers import evaluate

    assert with_personal["loss"] == pytest.approx(evaluate(ref, node.data.x_test, node.data.y_test).loss)
    node.load(list(received.values()))
    assert node.evaluate({})["loss"] != pytest.approx(with_personal["loss"])  # without Ditto: the received model


@pytest.fixture
def _identity():
    fb.set_task_identity()


def test_message_ditto_sends_lambda_to_train_and_evaluate(_identity):
    grid = fb.FakeGrid([1, 2])
    strat = strategies.message.Ditto(lam=0.5, fraction_train=1.0, min_train_nodes=2, min_available_nodes=2)
    arrays = ArrayRecord({"fc.weight": fb.Array(np.zeros((2, 3), np.float32)), "fc.bias": fb.Array(np.zeros(2, np.float32))})
    msgs = list(strat.configure_train(1, arrays, ConfigRecord({"lr": 0.1}), grid))
    assert all(m.content["config"]["ditto-lambda"] == 0.5 for m in msgs)
    replies = [fb.train_reply(m, {"fc.weight": np.full((2, 3), float(m.metadata.dst_node_id), np.float32),
                                  "fc.bias": np.zeros(2, np.float32)}, num_examples=10 * m.metadata.dst_node_id) for m in msgs]
    new, _ = strat.aggregate_train(1, replies)
    assert np.allclose(new["fc.weight"].numpy(), (1 * 10 + 2 * 20) / 30)  # FedAvg, weighted by samples
    evals = list(strat.configure_evaluate(1, new, ConfigRecord(), grid))
    assert all(m.content["config"]["ditto-lambda"] == 0.5 for m in evals)


def test_dittos_regularizer_pulls_the_personal_model_toward_the_global_one():
    from flower_pfl.methods.ditto import ditto_personal_step

    x, y = _data()
    torch.manual_seed(1)
    model = MLR(4, 2)
    received = [p.detach().clone() for p in model.parameters()]
    personal = flatten_module(model) + 1.0  # the personal model sits away from w

    def distance(lam: float) -> float:
        _, v = ditto_personal_step(model, personal, received, x, y, lam=lam, steps=10, lr=0.05, batch_size=8,
                                   generator=torch.Generator().manual_seed(3))
        return float(((v - torch.cat([r.flatten() for r in received])) ** 2).sum())

    assert distance(5.0) < 0.5 * distance(0.0)
