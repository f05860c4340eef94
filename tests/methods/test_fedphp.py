"""FedPHP (Li et al. 2021): the MMD and the inheritance schedule by hand, two rounds of a client by hand
(the HPM kept in its state), its evaluation of the HPM, a round's clients trained together as one by one, the server (FedAvg) with fabricated replies, what
it refuses, and a short run (λ = 0 trains as FedAvg)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from batching import BATCH, assert_together_is_one_by_one, clients, load
from batching import LR as BATCH_LR
from floats import assert_same_math, same_math

from client_apps.own_loop import algorithm_for
from flower_pfl.engine.batched import unbatched
from flower_pfl.engine.client_algorithm import CLIENT_ALGORITHM, LR, TrainData, train_locally
from flower_pfl.engine.layout import flatten_module, load_flat_
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.engine.minibatches import MinibatchStream
from flower_pfl.engine.reply_checks import RawReply
from flower_pfl.experiment.models import DNN, build_model
from flower_pfl.methods.fedphp import (
    COUNT_STATE,
    HPM_STATE,
    LAMBDA,
    MU,
    RAMP,
    FedPHP,
    FedPHPClient,
    inherit,
    inheritance,
    transfer_mmd,
)

from .runs import assert_as_recorded, short_run


def test_the_mmd_by_hand_on_two_points():
    x, y = torch.tensor([[0.0]]), torch.tensor([[2.0]])
    # the mean squared distance between distinct points is 4: bandwidths 4 · 2^(k−2), k = 0..4
    kernel = sum(math.exp(-4.0 / (4.0 * 2.0 ** (k - 2))) for k in range(5))
    assert float(transfer_mmd(x, y)) == pytest.approx(5 + 5 - 2 * kernel)
    same = torch.randn(6, 3, generator=torch.Generator().manual_seed(0))
    assert float(transfer_mmd(same, same)) == pytest.approx(0.0, abs=1e-6)


def test_the_inheritance_grows_with_participations_to_mu():
    assert [inheritance(0.9, c, 4) for c in (0, 1, 2, 4, 9)] == pytest.approx([0.0, 0.225, 0.45, 0.9, 0.9])
    assert torch.allclose(inherit(torch.tensor([1.0, 3.0]), torch.tensor([5.0, -1.0]), 0.25), torch.tensor([4.0, 0.0]))


def _data() -> TrainData:
    x = torch.randn(40, 5, generator=torch.Generator().manual_seed(0))
    return TrainData(x, (x[:, 0] > 0).long() + (x[:, 1] > 0).long())


def _model(seed: int = 1) -> DNN:
    torch.manual_seed(seed)
    return DNN(5, 4, 3)


def _config(lam: float = 0.5, mu: float = 0.9, ramp: int = 2) -> dict:
    return {CLIENT_ALGORITHM: "fedphp", LAMBDA: lam, MU: mu, RAMP: ramp, LR: 0.2}


def _features(model, x):
    return torch.relu(model.fc1(x))  # the head's input


def _by_hand(model, hpm, data, seed, lam, steps=3):
    """(1 − λ) CE + λ MMD(h(x; w), h(x; HPM)) by SGD, the HPM's representation a constant."""
    stream = MinibatchStream(len(data.y), 8, torch.Generator().manual_seed(seed))
    for _ in range(steps):
        idx = stream.next()
        x, y = data.x[idx], data.y[idx]
        loss = (1 - lam) * F.cross_entropy(model(x), y) + lam * transfer_mmd(_features(model, x), _features(hpm, x).detach())
        grads = torch.autograd.grad(loss, list(model.parameters()))
        with torch.no_grad():
            for p, g in zip(model.parameters(), grads):
                p -= 0.2 * g


def _train(model, state, seed, **config):
    return train_locally(FedPHPClient(model, _config(**config), state), model, _data(), steps=3, lr=0.2, batch_size=8,
                         generator=torch.Generator().manual_seed(seed))


def test_two_rounds_by_hand_with_the_hpm_kept_in_the_state():
    data, state = _data(), {}
    model = _model()
    ref, teacher = copy.deepcopy(model), copy.deepcopy(model)  # before the first participation the HPM is the received model
    _, extras = _train(model, state, seed=3)
    _by_hand(ref, teacher, data, seed=3, lam=0.5)
    assert extras == {CLIENT_ALGORITHM: "fedphp"}
    assert torch.allclose(flatten_module(model), flatten_module(ref), atol=1e-6)
    hpm = flatten_module(ref)  # μ_1 = 0: the HPM becomes the local model
    assert torch.allclose(state[HPM_STATE][0], hpm, atol=1e-6) and state[COUNT_STATE][0].item() == 1

    new_global = _model(seed=7)
    ref = copy.deepcopy(new_global)
    load_flat_(teacher, hpm)
    _train(new_global, state, seed=4)
    _by_hand(ref, teacher, data, seed=4, lam=0.5)
    assert torch.allclose(flatten_module(new_global), flatten_module(ref), atol=1e-6)
    mu = 0.9 * 1 / 2  # one earlier participation of the ramp's two
    assert torch.allclose(state[HPM_STATE][0], mu * hpm + (1 - mu) * flatten_module(ref), atol=1e-6)
    assert state[COUNT_STATE][0].item() == 2


def test_the_hpm_teaches_in_evaluation_mode_so_its_batch_norm_statistics_are_only_inherited():
    torch.manual_seed(0)
    model, hpm = DNN(5, 4, 3, batch_norm=True), DNN(5, 4, 3, batch_norm=True)
    with torch.no_grad():
        hpm.bn1.running_mean.fill_(0.5)
        hpm.bn1.running_var.fill_(2.0)
    old = flatten_module(hpm)
    state = {HPM_STATE: [old.clone()], COUNT_STATE: [torch.tensor([2])]}
    _train(model, state, seed=6, ramp=2)  # μ_k = 0.9
    assert torch.allclose(state[HPM_STATE][0], inherit(old, flatten_module(model), 0.9), atol=1e-6)


def test_the_transfer_changes_training_and_without_it_training_is_plain_sgd():
    received = _model()
    plain, transferred, sgd = copy.deepcopy(received), copy.deepcopy(received), copy.deepcopy(received)
    far = flatten_module(_model(seed=9))
    _train(plain, {HPM_STATE: [far]}, seed=5, lam=0.0)
    _train(transferred, {HPM_STATE: [far]}, seed=5, lam=0.9)
    stream = MinibatchStream(40, 8, torch.Generator().manual_seed(5))
    optimizer = torch.optim.SGD(sgd.parameters(), lr=0.2)
    for _ in range(3):
        idx = stream.next()
        optimizer.zero_grad()
        F.cross_entropy(sgd(_data().x[idx]), _data().y[idx]).backward()
        optimizer.step()
    assert torch.allclose(flatten_module(plain), flatten_module(sgd), atol=1e-6)
    assert not torch.allclose(flatten_module(transferred), flatten_module(plain), atol=1e-4)


def test_the_client_evaluates_its_hpm_and_needs_the_packages_clientapp():
    model, state = _model(), {}
    assert FedPHPClient.evaluation_model(model, {}, state, _data(), lambda m: None)[0] is model  # none yet: as received
    hpm = flatten_module(_model(seed=5))
    evaluated, _ = FedPHPClient.evaluation_model(_model(), {}, {HPM_STATE: [hpm]}, _data(), lambda m: None)
    assert torch.equal(flatten_module(evaluated), hpm)
    with pytest.raises(ValueError, match="client_apps.app"):
        algorithm_for(_config(), _model(), None)
    with pytest.raises(ValueError, match="context.state"):
        FedPHPClient(_model(), _config())
    with pytest.raises(ValueError, match="fedphp-ramp"):
        FedPHPClient(_model(), {LAMBDA: 0.1, MU: 0.9, LR: 0.1}, {})
    with pytest.raises(ValueError, match="fedphp-lambda"):
        FedPHPClient(_model(), _config(lam=1.5), {})
    for bad in ({"mu": 1.2}, {"lam": -0.1}, {"ramp": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            FedPHP(**bad)


@pytest.mark.parametrize("name", ["dnn", "dnn-bn"])
def test_a_round_s_clients_train_together_as_one_by_one(name):
    """A later round: each client's own HPM (its first round's local model; the first client has none: the
    received model) teaches it, and each inherits with its own μ_k (participations 1, 2, 3); the models, losses,
    HPMs and counts kept are the same both ways."""
    model = build_model(name, (6,), 3, seed=0)
    assert unbatched(FedPHPClient, model) is None
    config = _config(lam=0.5, ramp=3)
    datas, starts = clients(model, (6,))
    firsts: list[dict] = [{} for _ in datas]
    for i in range(1, len(datas)):
        first = copy.deepcopy(model)
        load(first, [t - 0.05 * i if t.is_floating_point() else t for t in starts[i]])
        train_locally(FedPHPClient(first, config, firsts[i]), first, datas[i], steps=3, lr=BATCH_LR, batch_size=BATCH,
                      generator=torch.Generator().manual_seed(10 + i))
        firsts[i][COUNT_STATE] = [torch.tensor([i])]
    made: list[dict] = []

    def make(m, i):
        made.append(dict(firsts[i]))
        return FedPHPClient(m, config, made[-1])

    assert_together_is_one_by_one(model, (6,), make)
    assert len(made) == 2 * len(datas)
    for alone, together in zip(made[:len(datas)], made[len(datas):]):
        assert_same_math(together[HPM_STATE][0], alone[HPM_STATE][0])
        assert torch.equal(together[COUNT_STATE][0], alone[COUNT_STATE][0])
    assert [s[COUNT_STATE][0].item() for s in made[len(datas):]] == [1, 2, 3, 4]


def test_the_server_is_fedavg_and_sends_the_knobs():
    arrays = lambda v: {k: torch.full(t.shape, v).numpy() for k, t in _model().state_dict().items()}
    server = MethodServer(FedPHP(mu=0.8, lam=0.2, ramp=5), clients_per_round=2)
    server.initialize(arrays(0.0))
    plan = server.plan_training(1, [1, 2])
    assert all(ins.config == {CLIENT_ALGORITHM: "fedphp", MU: 0.8, LAMBDA: 0.2, RAMP: 5} for ins in plan)
    replies = [server.check(RawReply(i.client_id, list(arrays(float(i.client_id)).values()), None, 10 * i.client_id, {},
                                     {CLIENT_ALGORITHM: "fedphp"})) for i in plan]
    new = server.aggregate(1, replies)
    assert torch.allclose(new, torch.full_like(new, (1 * 10 + 2 * 20) / 30))


def test_short_run_as_recorded_and_without_transfer_it_trains_as_fedavg(short_runs, tmp_path):
    run, fedavg = short_runs("fedphp"), short_runs("fedavg")
    plain = short_run("fedphp", tmp_path, **{"fedphp-lambda": 0.0})
    assert plain["train_loss"] == same_math(fedavg["train_loss"])  # the same global models; the HPMs are evaluated
    assert plain["client_loss"] != pytest.approx(fedavg["client_loss"], rel=1e-3)
    assert run["train_loss"] != pytest.approx(fedavg["train_loss"], rel=1e-3)  # the transfer changes training
    assert_as_recorded("fedphp", run)
