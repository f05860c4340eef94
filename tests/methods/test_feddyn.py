"""FedDyn (Acar et al. 2021), Algorithm 1: the client's regularized steps and gradient state by hand,
the fixed point of the regularizer, the server's h and model by hand, the client algorithm in a user's
own loop, the running statistics left out of h, a short run."""

from __future__ import annotations

import copy

import fabricate as fb
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from floats import assert_same_math
from flwr.app import RecordDict

from client_apps.own_loop import RecordState, algorithm_for
from flower_pfl.engine.client_algorithm import CLIENT_ALGORITHM, LR, TrainData, train_locally
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.engine.minibatches import MinibatchStream
from flower_pfl.engine.reply_checks import RawReply
from flower_pfl.experiment.models import MLR, build_model
from flower_pfl.methods.feddyn import ALPHA, GRADIENT_STATE, FedDyn, FedDynClient, dynamic_server_update
from flower_pfl.methods.registry import client_algorithm_for

from .runs import assert_as_recorded


def _data():
    x = torch.randn(32, 3, generator=torch.Generator().manual_seed(0))
    return x, (x[:, 1] > 0).long()


def _params(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _train(model, state, alpha, steps, seed, lr=0.1):
    x, y = _data()
    step = FedDynClient(model, {LR: lr, ALPHA: alpha}, state)
    return train_locally(step, model, TrainData(x, y), steps=steps, lr=lr, batch_size=8, generator=torch.Generator().manual_seed(seed))


# --- the client, by hand --------------------------------------------------------------------------

def test_two_rounds_by_hand():
    """θ ← θ − η(∇L_k(θ) − ∇L_k(θ_k^{t−1}) + α(θ − θ^{t−1})); then ∇L_k(θ_k^t) = ∇L_k(θ_k^{t−1}) − α(θ_k^t − θ^{t−1})."""
    x, y = _data()
    torch.manual_seed(0)
    model = MLR(3, 2)
    ref = copy.deepcopy(model)
    state: dict = {}
    gradient = [torch.zeros_like(p) for p in model.parameters()]
    for rnd, alpha in ((1, 0.5), (2, 0.5)):
        received = _params(ref)
        _train(model, state, alpha, steps=4, seed=rnd)
        stream = MinibatchStream(32, 8, torch.Generator().manual_seed(rnd))
        for _ in range(4):
            idx = stream.next()
            grads = torch.autograd.grad(F.cross_entropy(ref(x[idx]), y[idx]), list(ref.parameters()))
            with torch.no_grad():
                for p, g, gk, r in zip(ref.parameters(), grads, gradient, received):
                    p -= 0.1 * (g - gk + alpha * (p - r))
        gradient = [gk - alpha * (p.detach() - r) for gk, p, r in zip(gradient, ref.parameters(), received)]
        for a, b in zip(model.parameters(), ref.parameters()):
            assert torch.allclose(a, b, atol=1e-6)
        for kept, expected in zip(state[GRADIENT_STATE], gradient):
            assert torch.allclose(kept, expected, atol=1e-5)
    assert any(g.abs().sum() > 1e-3 for g in gradient)  # the state really moves


def test_without_a_data_gradient_the_regularizer_has_its_fixed_point():
    """L_k ≡ 0: the minimum of −⟨∇L_k, θ⟩ + α/2 ||θ − θ^{t−1}||² is θ^{t−1} + ∇L_k/α, where the new state is 0."""
    model = torch.nn.Linear(3, 2, bias=False)
    torch.nn.init.constant_(model.weight, 1.0)
    state = {GRADIENT_STATE: [torch.full((2, 3), 0.3)]}
    x, y = torch.zeros(8, 3), torch.zeros(8, dtype=torch.long)
    step = FedDynClient(model, {LR: 0.5, ALPHA: 1.0}, state)
    train_locally(step, model, TrainData(x, y), steps=60, lr=0.5, batch_size=4, generator=torch.Generator())
    assert torch.allclose(model.weight, torch.full((2, 3), 1.3), atol=1e-6)  # θ^{t−1} + ∇L_k / α
    assert torch.allclose(state[GRADIENT_STATE][0], torch.zeros(2, 3), atol=1e-6)


def test_the_regularizer_pulls_toward_the_received_model():
    def distance(alpha: float) -> float:
        torch.manual_seed(0)
        model = MLR(3, 2)
        start = _params(model)
        _train(model, {}, alpha, steps=20, seed=1, lr=0.2)
        return sum(float(((p - s) ** 2).sum()) for p, s in zip(model.parameters(), start))

    assert distance(2.0) < 0.6 * distance(1e-6)


def test_the_step_needs_state_and_a_positive_alpha():
    model = MLR(3, 2)
    with pytest.raises(ValueError, match="state"):
        FedDynClient(model, {LR: 0.1, ALPHA: 0.1})
    with pytest.raises(ValueError, match="alpha"):
        FedDynClient(model, {LR: 0.1, ALPHA: 0.0}, {})
    with pytest.raises(ValueError, match="alpha"):
        FedDyn(alpha=-1.0)
    assert client_algorithm_for({CLIENT_ALGORITHM: "feddyn", ALPHA: 0.1}) is FedDynClient


def test_users_loop_matches_train_locally_over_two_rounds():
    x, y = _data()
    torch.manual_seed(2)
    ours, theirs = MLR(3, 2), MLR(3, 2)
    theirs.load_state_dict(ours.state_dict())
    ours_state, their_state = {}, RecordDict()
    for rnd in (1, 2):
        config = {CLIENT_ALGORITHM: "feddyn", LR: 0.1, ALPHA: 0.3, "local-steps": 3, "batch-size": 8}
        train_locally(FedDynClient(ours, config, ours_state), ours, TrainData(x, y), steps=3, lr=0.1, batch_size=8,
                      generator=torch.Generator().manual_seed(rnd))
        step = algorithm_for(config, theirs, their_state, torch.optim.SGD(theirs.parameters(), lr=0.1))
        extras = fb.user_loop(theirs, step, x, y, lr=0.1, batch_size=8, steps=3, seed=rnd)
        assert extras == {CLIENT_ALGORITHM: "feddyn"}
        for a, b in zip(ours.parameters(), theirs.parameters()):
            assert_same_math(a, b)
        for a, b in zip(ours_state[GRADIENT_STATE], RecordState(their_state)[GRADIENT_STATE]):
            assert_same_math(a, b)
        theirs.load_state_dict(ours.state_dict())


# --- the server, by hand --------------------------------------------------------------------------

def test_server_update_by_hand():
    theta, h = torch.tensor([1.0, 0.0]), torch.tensor([0.1, -0.2])
    models = torch.tensor([[2.0, 1.0], [0.0, 3.0]])
    new, new_h = dynamic_server_update(theta, h, models, alpha=0.5, num_clients=4)
    drift = torch.tensor([(2 - 1) + (0 - 1), (1 - 0) + (3 - 0)])  # Σ_k (θ_k − θ)
    assert torch.allclose(new_h, h - 0.5 / 4 * drift)
    assert torch.allclose(new, torch.tensor([1.0, 2.0]) - new_h / 0.5)


def _arrays(value: float) -> dict[str, np.ndarray]:
    return {"fc.weight": np.full((2, 3), value, np.float32), "fc.bias": np.full(2, value, np.float32)}


def test_method_server_two_rounds_by_hand():
    """m is every connected client; the mean over participants is uniform (not sample-weighted)."""
    server = MethodServer(FedDyn(alpha=0.5), clients_per_round=2, seed=1)
    server.initialize(_arrays(1.0))
    plan = server.plan_training(1, [5, 6, 7, 8])
    assert all(ins.config == {CLIENT_ALGORITHM: "feddyn", ALPHA: 0.5} for ins in plan)
    replies = [server.check(RawReply(ins.client_id, list(_arrays(1.0 + 2 * i).values()), None, 10 + 90 * i, {})) for i, ins in enumerate(plan)]
    new = server.aggregate(1, replies)  # models 1 and 3, θ = 1: h = −0.5/4 · 2 = −0.25; θ = 2 + 0.25/0.5
    assert torch.allclose(server.method.h, torch.full((8,), -0.25))
    assert torch.allclose(new, torch.full((8,), 2.5))
    plan = server.plan_training(2, [5, 6, 7, 8])
    replies = [server.check(RawReply(ins.client_id, list(_arrays(2.5).values()), None, 10, {})) for ins in plan]
    new = server.aggregate(2, replies)  # no drift: h stays, θ = 2.5 + 0.5
    assert torch.allclose(new, torch.full((8,), 3.0))
    state = server.method.get_state()
    assert torch.equal(state["h"], server.method.h)


def test_running_statistics_are_averaged_without_h():
    model = build_model("dnn-bn", (3,), 2, hidden_units=2, seed=0)
    initial = {k: v.numpy() for k, v in model.state_dict().items()}
    server = MethodServer(FedDyn(alpha=0.5), clients_per_round=2)
    server.initialize(initial)
    server.plan_training(1, [1, 2])
    replies = []
    for cid, value in ((1, 1.0), (2, 5.0)):
        arrays = {k: np.full_like(v, value) for k, v in initial.items()}
        replies.append(server.check(RawReply(cid, list(arrays.values()), list(arrays), 10, {})))
    server.aggregate(1, replies)
    new = server.layout.unflatten(server.method.model)
    h = server.layout.unflatten(server.method.h)
    for name in ("bn1.running_mean", "bn1.running_var", "bn1.num_batches_tracked"):
        assert torch.all(new[name] == 3.0) and torch.all(h[name] == 0)
    assert torch.all(h["bn1.weight"] != 0) and not torch.allclose(new["fc1.weight"], torch.full_like(new["fc1.weight"], 3.0))


# --- a whole run ----------------------------------------------------------------------------------

def test_short_run_as_recorded_and_better_than_fedavg(short_runs):
    run, fedavg = short_runs("feddyn"), short_runs("fedavg")
    assert run["final_accuracy"] > fedavg["final_accuracy"] + 0.15  # observed 0.63 vs 0.31
    assert_as_recorded("feddyn", run)
