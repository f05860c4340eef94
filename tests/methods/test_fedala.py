"""FedALA: the higher layers, the element-wise weight learning by hand, its exact s% sample, the
client algorithm over three rounds (plain first round, weights learned until the loss settles, then one epoch), the evaluated
local model, the server's FedAvg and settings, and a short whole run."""

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import RecordDict

from client_apps.own_loop import algorithm_for
from flower_pfl.engine.client_algorithm import BATCH_SIZE, CLIENT_ALGORITHM, LR, SERVER_ROUND, ClientAlgorithm, TrainData, train_locally
from flower_pfl.engine.layout import flatten_module, load_flat_
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.engine.minibatches import MinibatchStream
from flower_pfl.engine.reply_checks import RawReply
from flower_pfl.experiment.models import DNN
from flower_pfl.methods.fedala import (
    ETA,
    LAYERS,
    LOCAL_STATE,
    RAND_PERCENT,
    SEED,
    WEIGHTS_STATE,
    FedALA,
    FedALAClient,
    ala_init,
    higher_layers,
    learn_weights,
    sample_indices,
)

from .runs import assert_as_recorded


def _model(seed: int = 0) -> DNN:
    torch.manual_seed(seed)
    return DNN(3, 2, hidden=4)


def _data():
    x = torch.randn(40, 3, generator=torch.Generator().manual_seed(0))
    return x, (x[:, 1] > 0).long()


def test_higher_layers_are_the_last_modules():
    model = _model()
    assert higher_layers(model, 1) == ["fc2.weight", "fc2.bias"]
    assert higher_layers(model, 2) == higher_layers(model, 9) == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]


def test_weight_learning_by_hand():
    """Per batch: θ̂ = θ + (Θ − θ) ⊙ W; W ← clip(W − η ∂L/∂θ̂ ⊙ (Θ − θ), 0, 1); lower layers are Θ's."""
    x, y = _data()
    model = _model()
    glob = {n: p.detach().clone() for n, p in model.named_parameters()}
    local = {n: t + torch.linspace(-1, 1, t.numel()).view_as(t) for n, t in glob.items() if n.startswith("fc2")}
    weights = {n: torch.full_like(t, 0.6) for n, t in local.items()}
    batches = [(x[:8], y[:8]), (x[8:16], y[8:16])]
    got = learn_weights(model, local, {n: glob[n] for n in local}, dict(weights), batches, 2.0, F.cross_entropy, False)
    w2, b2 = weights["fc2.weight"], weights["fc2.bias"]
    for bx, by in batches:
        mixed_w = (local["fc2.weight"] + (glob["fc2.weight"] - local["fc2.weight"]) * w2).requires_grad_(True)
        mixed_b = (local["fc2.bias"] + (glob["fc2.bias"] - local["fc2.bias"]) * b2).requires_grad_(True)
        hidden = torch.relu(bx @ glob["fc1.weight"].T + glob["fc1.bias"])
        gw, gb = torch.autograd.grad(F.cross_entropy(hidden @ mixed_w.T + mixed_b, by), [mixed_w, mixed_b])
        w2 = (w2 - 2.0 * gw * (glob["fc2.weight"] - local["fc2.weight"])).clamp(0, 1)
        b2 = (b2 - 2.0 * gb * (glob["fc2.bias"] - local["fc2.bias"])).clamp(0, 1)
    torch.testing.assert_close(got["fc2.weight"], w2)
    torch.testing.assert_close(got["fc2.bias"], b2)
    assert float(got["fc2.weight"].min()) >= 0 and float(got["fc2.weight"].max()) <= 1
    torch.testing.assert_close(ala_init(local, glob, {"fc2.bias": torch.zeros(2)})["fc2.bias"], local["fc2.bias"])  # W = 0: θ_i


def _config(percent: float = 50.0, server_round: int = 1) -> dict:
    return {CLIENT_ALGORITHM: "fedala", LR: 0.1, BATCH_SIZE: 8, LAYERS: 1, ETA: 1.0, RAND_PERCENT: percent, SEED: 5,
            SERVER_ROUND: server_round}


def _round(model, state, seed):
    x, y = _data()
    return train_locally(FedALAClient(model, _config(server_round=seed), state), model, TrainData(x, y), steps=3, lr=0.1,
                         batch_size=8, generator=torch.Generator().manual_seed(seed))


def _sample_by_hand(n: int, percent: float, seed: int, server_round: int) -> torch.Tensor:
    """round(s% · n) indices: the head of the permutation seeded by SeedSequence([seed, round, n])."""
    state = int(np.random.SeedSequence([seed, server_round, n]).generate_state(1)[0])
    return torch.randperm(n, generator=torch.Generator().manual_seed(state))[:round(percent / 100 * n)]


def test_the_weights_sample_has_exactly_s_percent_of_the_split_and_is_seeded():
    x, y = _data()
    for n, percent, size in ((40, 50.0, 20), (40, 80.0, 32), (37, 80.0, 30), (40, 100.0, 40), (3, 10.0, 1)):
        idx = sample_indices(n, percent, 5, 2)
        assert len(idx) == size and len(set(idx.tolist())) == size and int(idx.max()) < n  # distinct examples
    assert torch.equal(sample_indices(40, 50.0, 5, 2), _sample_by_hand(40, 50.0, 5, 2))
    assert torch.equal(sample_indices(40, 50.0, 5, 2), sample_indices(40, 50.0, 5, 2))  # reproducible (resumes too)
    assert not torch.equal(sample_indices(40, 50.0, 5, 3), sample_indices(40, 50.0, 5, 2))  # another round, another sample
    assert not torch.equal(sample_indices(40, 50.0, 6, 2), sample_indices(40, 50.0, 5, 2))  # another run seed
    batches = FedALAClient(_model(), _config(server_round=2), {}).sample(TrainData(x, y))
    assert [len(b) for _, b in batches] == [8, 8, 4]  # the 20 examples in minibatches of batch-size
    idx = _sample_by_hand(40, 50.0, 5, 2)
    assert torch.equal(torch.cat([bx for bx, _ in batches]), x[idx]) and torch.equal(torch.cat([by for _, by in batches]), y[idx])


def _sgd(model, batches, x, y):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for idx in batches:
        optimizer.zero_grad()
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        optimizer.step()


def test_three_rounds_plain_then_learned_until_settled_then_one_epoch():
    x, y = _data()
    state: dict = {}
    model = _model()
    plain = copy.deepcopy(model)
    _round(model, state, seed=1)  # round 1: no local model yet, plain local SGD on the global model
    train_locally(ClientAlgorithm(plain, {}), plain, TrainData(x, y), steps=3, lr=0.1, batch_size=8,
                  generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(state[LOCAL_STATE][0], flatten_module(plain))
    assert set(state) == {LOCAL_STATE}

    for rnd, first in ((2, True), (3, False)):
        glob = _model(seed=10 + rnd)  # the round's global model
        local = _model()
        load_flat_(local, state[LOCAL_STATE][0])
        ref = copy.deepcopy(glob)
        names = ["fc2.weight", "fc2.bias"]
        g = {n: p.detach().clone() for n, p in glob.named_parameters() if n in names}
        th = {n: p.detach().clone() for n, p in local.named_parameters() if n in names}
        w0 = {n: torch.ones_like(t) for n, t in g.items()} if first else \
            dict(zip(names, (t.view_as(g[n]) for n, t in zip(names, state[WEIGHTS_STATE][0].split([8, 2])))))
        sample = _sample_by_hand(40, 50.0, 5, rnd)  # s = 50% of 40 examples: 20, in batches of 8, 8 and 4
        batches = [sample[:8], sample[8:16], sample[16:]]
        w = learn_weights(ref, th, g, w0, [(x[i], y[i]) for i in batches], 1.0, F.cross_entropy, first)
        stream = MinibatchStream(40, 8, torch.Generator().manual_seed(rnd))  # the training minibatches: untouched
        with torch.no_grad():
            for n, t in ala_init(th, g, w).items():
                dict(ref.named_parameters())[n].copy_(t)
        _sgd(ref, [stream.next() for _ in range(3)], x, y)
        _round(glob, state, seed=rnd)
        torch.testing.assert_close(flatten_module(glob), flatten_module(ref), atol=1e-6, rtol=0)
        torch.testing.assert_close(state[WEIGHTS_STATE][0], torch.cat([w[n].flatten() for n in names]))


def test_the_client_evaluates_its_local_model_and_needs_state():
    model = _model()
    local = torch.arange(sum(p.numel() for p in model.parameters()), dtype=torch.float32)
    evaluated, _ = FedALAClient.evaluation_model(model, {CLIENT_ALGORITHM: "fedala"}, {LOCAL_STATE: [local]}, None, None)
    assert torch.equal(flatten_module(evaluated), local)
    with pytest.raises(ValueError, match="state"):
        FedALAClient(model, _config())
    with pytest.raises(ValueError, match="fedala-rand-percent"):
        FedALAClient(model, _config(percent=0.0), {})


def test_not_a_hook_on_a_users_loop():
    with pytest.raises(ValueError, match="client_apps.app"):
        algorithm_for(_config(), _model(), RecordDict())


# --- the server ------------------------------------------------------------------------------------

def _arrays(value: float) -> dict[str, np.ndarray]:
    return {"fc.weight": np.full((2, 3), value, np.float32), "fc.bias": np.full(2, value, np.float32)}


def test_server_is_fedavg_and_sends_the_settings():
    server = MethodServer(FedALA(eta=0.5, rand_percent=30.0, layers=2), clients_per_round=2, seed=0)
    server.initialize(_arrays(0.0))
    plan = server.plan_training(1, [1, 2])
    assert all(ins.config == {CLIENT_ALGORITHM: "fedala", LAYERS: 2, ETA: 0.5, RAND_PERCENT: 30.0, SEED: 0} for ins in plan)
    new = server.aggregate(1, [server.check(RawReply(c, list(_arrays(float(c)).values()), None, 10 * c, {})) for c in (1, 2)])
    torch.testing.assert_close(new, torch.full((8,), (1 * 10 + 2 * 20) / 30))
    assert all(e.config == {CLIENT_ALGORITHM: "fedala"} for e in server.plan_evaluation(1, [1, 2], 1.0))


@pytest.mark.parametrize("kwargs, name", [({"eta": 0.0}, "eta"), ({"rand_percent": 120.0}, "rand_percent"),
                                          ({"rand_percent": 0.0}, "rand_percent"), ({"layers": 0}, "layers")])
def test_bad_hyperparameters_are_refused(kwargs, name):
    with pytest.raises(ValueError, match=f"{name} = "):
        FedALA(**kwargs)


# --- a whole run -----------------------------------------------------------------------------------

def test_short_run_as_recorded_and_far_better_than_fedavg(short_runs):
    fedala = short_runs("fedala")
    assert fedala["bmta"] > short_runs("fedavg")["bmta"] + 0.3  # observed 0.777 against 0.306
    assert_as_recorded("fedala", fedala)
