"""FedRep: the head's steps then the body's by hand (Algorithm 1), the same step in a user's loop, the
server's uniform mean of bodies with fabricated replies, the refused settings, one whole run."""

from __future__ import annotations

import fabricate as fb
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from client_apps.own_loop import algorithm_for
from flower_pfl.engine.client_algorithm import BATCH_SIZE, CLIENT_ALGORITHM, LOCAL_STEPS, LR, TrainData, train_locally
from flower_pfl.engine.layout import flatten_module
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.engine.minibatches import MinibatchStream
from flower_pfl.engine.model_split import head_flags
from flower_pfl.engine.reply_checks import RawReply
from flower_pfl.experiment.config import ConfigError, ExperimentConfig
from flower_pfl.experiment.models import DNN
from flower_pfl.methods.fedrep import BODY_STEPS, HEAD_LAYERS, FedRep, FedRepClient

from .runs import assert_as_recorded


def _data():
    x = torch.randn(24, 3, generator=torch.Generator().manual_seed(0))
    return x, (x[:, 0] + x[:, 2] > 0).long()


def _model(seed: int = 1) -> DNN:
    torch.manual_seed(seed)
    return DNN(3, 2, hidden=4)


def _config(steps: int = 4, body: int = 1) -> dict:
    return {LR: 0.1, LOCAL_STEPS: steps, BATCH_SIZE: 8, CLIENT_ALGORITHM: "fedrep", HEAD_LAYERS: 1, BODY_STEPS: body}


# --- the client algorithm, by hand ----------------------------------------------------------------------

def test_the_head_is_the_last_module():
    assert head_flags(_model(), 1) == [False, False, True, True]  # fc1.weight, fc1.bias | fc2.weight, fc2.bias


def test_head_steps_then_body_steps_by_hand():
    """Algorithm 1: τ_h = 3 steps h ← h − α∇_h f(h, φ) with φ fixed, then τ_φ = 1 step φ ← φ − α∇_φ f(h, φ)."""
    x, y = _data()
    model, ref = _model(), _model()
    train_locally(FedRepClient(model, _config()), model, TrainData(x, y), steps=4, lr=0.1, batch_size=8,
                  generator=torch.Generator().manual_seed(5))
    stream = MinibatchStream(24, 8, torch.Generator().manual_seed(5))
    body, head = [ref.fc1.weight, ref.fc1.bias], [ref.fc2.weight, ref.fc2.bias]
    start_body = [p.detach().clone() for p in body]
    for step in range(4):
        idx = stream.next()
        part = head if step < 3 else body
        grads = torch.autograd.grad(F.cross_entropy(ref(x[idx]), y[idx]), part)
        with torch.no_grad():
            for p, g in zip(part, grads):
                p -= 0.1 * g
        if step == 2:  # the head's steps never move the body
            assert all(torch.equal(p, s) for p, s in zip(body, start_body))
    torch.testing.assert_close(flatten_module(model), flatten_module(ref))
    assert not torch.equal(ref.fc1.weight, start_body[0])  # the last step moved the body


def test_a_users_loop_gives_the_package_loops_model_and_receipt():
    x, y = _data()
    mine, ours = _model(), _model()
    extras = fb.user_loop(mine, algorithm_for(_config(), mine, None, torch.optim.SGD(mine.parameters(), lr=0.1)), x, y,
                          lr=0.1, batch_size=8, steps=4, seed=5)
    train_locally(FedRepClient(ours, _config()), ours, TrainData(x, y), steps=4, lr=0.1, batch_size=8,
                  generator=torch.Generator().manual_seed(5))
    assert extras == {CLIENT_ALGORITHM: "fedrep"}
    torch.testing.assert_close(flatten_module(mine), flatten_module(ours))


def test_a_frozen_part_stays_put_even_with_momentum_and_weight_decay():
    x, y = _data()
    model = _model()
    head = [p.detach().clone() for p in model.fc2.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    step = algorithm_for(_config(steps=3, body=3 - 1), model, None, optimizer)  # 1 head step, then 2 body steps
    for i in range(3):
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        step.adjust_gradients(model, (x, y))
        optimizer.step()
        if i == 0:
            head = [p.detach().clone() for p in model.fc2.parameters()]  # moved by the head step only
    assert all(torch.equal(p, h) for p, h in zip(model.fc2.parameters(), head))


def test_the_step_needs_a_head_step_and_a_body_step():
    with pytest.raises(ValueError, match="fedrep-body-steps"):
        FedRepClient(_model(), _config(steps=2, body=2))
    with pytest.raises(ValueError, match="local-steps"):
        FedRepClient(_model(), {LR: 0.1, HEAD_LAYERS: 1, BODY_STEPS: 1})


# --- the server ------------------------------------------------------------------------------------

def _named(value: float) -> dict[str, np.ndarray]:
    shapes = {"fc1.weight": (2, 3), "fc1.bias": (2,), "fc2.weight": (2, 2), "fc2.bias": (2,)}
    return {k: np.full(s, value, dtype=np.float32) for k, s in shapes.items()}


def _reply(cid: int, value: float, n: int) -> RawReply:
    arrays = _named(value)
    return RawReply(cid, list(arrays.values()), list(arrays), n, {"num-examples": n})


def test_the_body_is_the_uniform_mean_and_heads_stay_with_their_clients():
    server = MethodServer(FedRep(), clients_per_round=2)
    server.initialize(_named(0.0))
    plan = server.plan_training(1, [1, 2])
    assert all(ins.config == {CLIENT_ALGORITHM: "fedrep", BODY_STEPS: 1, HEAD_LAYERS: 1} for ins in plan)
    server.aggregate(1, [server.check(_reply(1, 1.0, 1)), server.check(_reply(2, 4.0, 3))])
    torch.testing.assert_close(server.method.base, torch.full((8,), 2.5))  # (1 + 4) / 2: φ^{t+1} = (1/|I|) Σ φ_i, not by samples
    sent = {ins.client_id: ins.model for ins in server.plan_evaluation(1, [1, 2, 3], 1.0)}
    for cid, head in ((1, 1.0), (2, 4.0), (3, 0.0)):  # client 3 never trained: the initial head
        assert torch.all(sent[cid][:8] == 2.5) and torch.all(sent[cid][8:] == head)


def test_bad_hyperparameters_and_runs_are_refused():
    with pytest.raises(ValueError, match="body_steps = 0 is invalid"):
        FedRep(body_steps=0)
    with pytest.raises(ValueError, match="head_layers = 0 is invalid"):
        FedRep(head_layers=0)
    with pytest.raises(ConfigError, match="fedrep-body-steps"):
        ExperimentConfig(method="fedrep", model="dnn", local_steps=5, options={"fedrep-body-steps": 5})
    with pytest.raises(ConfigError, match="model"):
        ExperimentConfig(method="fedrep", model="mlr")


# --- one whole run ---------------------------------------------------------------------------------

def test_short_run_as_recorded_and_personal_heads_beat_fedavg(short_runs):
    fedrep = short_runs("fedrep")
    assert fedrep["bmta"] > short_runs("fedavg")["bmta"] + 0.2  # observed 0.669 vs 0.306
    assert_as_recorded("fedrep", fedrep)
