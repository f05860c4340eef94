"""MOON (Li, He, Song 2021): the model-contrastive loss by hand, the client's steps against the whole
loss ℓ_sup + μ ℓ_con written out, the previous model from the client state, the first round (no
gradient), batch-norm statistics untouched by the extra pass, the user's own loop, the server (FedAvg),
a short run (μ = 0 is FedAvg, up to the order of float sums)."""

from __future__ import annotations

import copy
import math

import fabricate as fb
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from batching import BATCH, assert_together_is_one_by_one, clients, load
from batching import LR as BATCH_LR
from floats import assert_same_math, same_math
from flwr.app import RecordDict

from client_apps.own_loop import RecordState, algorithm_for
from flower_pfl.engine.batched import unbatched
from flower_pfl.engine.client_algorithm import CLIENT_ALGORITHM, LR, ClientAlgorithm, TrainData, train_locally, trainable
from flower_pfl.engine.layout import flatten_module
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.engine.minibatches import MinibatchStream
from flower_pfl.engine.model_split import forward_with_features
from flower_pfl.engine.reply_checks import RawReply
from flower_pfl.experiment.models import DNN, build_model
from flower_pfl.methods.moon import MOON, MU, PREVIOUS_STATE, TAU, MoonClient, contrastive_loss

from .runs import assert_as_recorded, short_run


def _data():
    x = torch.randn(40, 4, generator=torch.Generator().manual_seed(0))
    return x, (x[:, 1] + x[:, 2] > 0).long()


def _model(seed: int) -> DNN:
    torch.manual_seed(seed)
    return DNN(4, 2, hidden=3)


def _config(mu=2.0, tau=0.5, lr=0.1):
    return {LR: lr, CLIENT_ALGORITHM: "moon", MU: mu, TAU: tau}


def _train(model, state, seed, steps=3, **kw):
    x, y = _data()
    return train_locally(MoonClient(model, _config(**kw), state), model, TrainData(x, y), steps=steps, lr=_config(**kw)[LR],
                         batch_size=8, generator=torch.Generator().manual_seed(seed))


def test_contrastive_loss_by_hand():
    z = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    z_glob = torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    z_prev = torch.tensor([[-1.0, 0.0], [1.0, 0.0]])
    sims = [(1 / math.sqrt(2), -1.0), (1.0, 0.0)]  # cos(z, z_glob), cos(z, z_prev) per sample
    tau = 0.5
    expected = np.mean([-math.log(math.exp(g / tau) / (math.exp(g / tau) + math.exp(p / tau))) for g, p in sims])
    assert float(contrastive_loss(z, z_glob, z_prev, tau)) == pytest.approx(expected, rel=1e-6)
    assert float(contrastive_loss(z, z_glob, z_glob, tau)) == pytest.approx(math.log(2))


def test_two_rounds_against_the_whole_loss_written_out():
    """Each step: w ← w − η ∇(ℓ_sup + μ ℓ_con) with z_glob from the received model and z_prev from the
    model the client kept last round."""
    x, y = _data()
    state: dict = {}
    model = _model(0)
    _train(model, state, seed=1)  # round 1: the previous model is the received one
    previous = copy.deepcopy(model)
    assert torch.allclose(state[PREVIOUS_STATE][0], flatten_module(model))
    received = _model(5)
    model = copy.deepcopy(received)
    ref = copy.deepcopy(received)
    _train(model, state, seed=2)
    stream = MinibatchStream(40, 8, torch.Generator().manual_seed(2))
    for _ in range(3):
        idx = stream.next()
        logits, z = forward_with_features(ref, x[idx])
        with torch.no_grad():
            z_glob, z_prev = forward_with_features(received, x[idx])[1], forward_with_features(previous, x[idx])[1]
        loss = F.cross_entropy(logits, y[idx]) + 2.0 * contrastive_loss(z, z_glob, z_prev, 0.5)
        grads = torch.autograd.grad(loss, list(ref.parameters()))
        with torch.no_grad():
            for p, g in zip(ref.parameters(), grads):
                p -= 0.1 * g
    assert torch.allclose(flatten_module(model), flatten_module(ref), atol=1e-6)
    assert not torch.allclose(flatten_module(model), flatten_module(_plain(received, seed=2)), atol=1e-4)  # ℓ_con mattered


def _plain(received, seed):
    x, y = _data()
    model = copy.deepcopy(received)
    train_locally(ClientAlgorithm(model, {}), model, TrainData(x, y), steps=3, lr=0.1, batch_size=8,
                  generator=torch.Generator().manual_seed(seed))
    return model


def test_first_round_has_no_contrastive_gradient():
    """Before a client has a previous model, z_prev = z_glob: ℓ_con = log 2 whatever w, so the steps are plain SGD."""
    model = _model(0)
    received = copy.deepcopy(model)
    _train(model, {}, seed=3)
    assert torch.allclose(flatten_module(model), flatten_module(_plain(received, seed=3)), atol=1e-6)


def test_the_extra_pass_leaves_bn_statistics_alone():
    model = build_model("dnn-bn", (4,), 2, hidden_units=3, seed=0)
    model.train()
    x = torch.randn(8, 4) + 2.0
    previous = build_model("dnn-bn", (4,), 2, hidden_units=3, seed=1)  # another previous model: ℓ_con has a gradient
    algorithm = MoonClient(model, _config(), {PREVIOUS_STATE: [flatten_module(previous)]})
    before = {k: v.clone() for k, v in model.state_dict().items()}
    grads = algorithm.gradient_terms(trainable(model), (x, None))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert any(g.abs().sum() > 0 for g in grads)
    with torch.no_grad():  # gradients are on inside adjust_gradients' no_grad, too
        assert any(g.abs().sum() > 0 for g in algorithm.gradient_terms(trainable(model), (x, None)))


def test_users_loop_matches_train_locally_over_two_rounds():
    x, y = _data()
    ours, theirs = _model(1), _model(1)
    ours_state, their_state = {}, RecordDict()
    for rnd in (1, 2):
        config = {**_config(), "local-steps": 3, "batch-size": 8}
        train_locally(MoonClient(ours, config, ours_state), ours, TrainData(x, y), steps=3, lr=0.1, batch_size=8,
                      generator=torch.Generator().manual_seed(rnd))
        step = algorithm_for(config, theirs, their_state, torch.optim.SGD(theirs.parameters(), lr=0.1))
        assert fb.user_loop(theirs, step, x, y, lr=0.1, batch_size=8, steps=3, seed=rnd) == {CLIENT_ALGORITHM: "moon"}
        assert_same_math(flatten_module(ours), flatten_module(theirs))
        assert_same_math(ours_state[PREVIOUS_STATE][0], RecordState(their_state)[PREVIOUS_STATE][0])
        theirs.load_state_dict(ours.state_dict())
    with pytest.raises(ValueError, match="adjust_gradients"):
        step.adjust_gradients(theirs)  # the step needs the minibatch


@pytest.mark.parametrize("name", ["dnn", "dnn-bn"])
def test_a_round_s_clients_train_together_as_one_by_one(name):
    """A second round: each client's previous model is the one its first round left (the first client never
    trained: the received model, no contrastive gradient); the models, losses and kept previous models are the
    same both ways."""
    model = build_model(name, (6,), 3, seed=0)
    assert unbatched(MoonClient, model) is None
    config = {CLIENT_ALGORITHM: "moon", LR: BATCH_LR, **MOON(mu=2.0, tau=0.5).train_config(4)}
    datas, starts = clients(model, (6,))
    firsts: list[dict] = [{} for _ in datas]
    for i in range(1, len(datas)):
        first = copy.deepcopy(model)
        load(first, [t + 0.05 * torch.randn_like(t) if t.is_floating_point() else t for t in starts[i]])
        train_locally(MoonClient(first, config, firsts[i]), first, datas[i], steps=3, lr=BATCH_LR, batch_size=BATCH,
                      generator=torch.Generator().manual_seed(10 + i))
    made: list[dict] = []

    def make(m, i):
        made.append(dict(firsts[i]))
        return MoonClient(m, config, made[-1])

    assert_together_is_one_by_one(model, (6,), make)
    assert len(made) == 2 * len(datas)
    for alone, together in zip(made[:len(datas)], made[len(datas):]):
        assert_same_math(together[PREVIOUS_STATE][0], alone[PREVIOUS_STATE][0])


def test_bad_hyperparameters_are_refused():
    with pytest.raises(ValueError, match="tau"):
        MOON(tau=0.0)
    with pytest.raises(ValueError, match="mu"):
        MOON(mu=-1.0)
    with pytest.raises(ValueError, match="tau"):
        MoonClient(_model(0), _config(tau=-1.0), {})
    with pytest.raises(ValueError, match="state"):
        MoonClient(_model(0), _config())


def test_server_is_fedavg_and_sends_mu_and_tau():
    arrays = lambda v: {k: np.full(t.shape, v, np.float32) for k, t in _model(0).state_dict().items()}
    server = MethodServer(MOON(mu=5.0, tau=0.2), clients_per_round=2)
    server.initialize(arrays(0.0))
    plan = server.plan_training(1, [1, 2])
    assert all(ins.config == {CLIENT_ALGORITHM: "moon", MU: 5.0, TAU: 0.2} for ins in plan)
    new = server.aggregate(1, [server.check(RawReply(i.client_id, list(arrays(float(i.client_id)).values()), None,
                                                     10 * i.client_id, {})) for i in plan])
    assert torch.allclose(new, torch.full_like(new, (1 * 10 + 2 * 20) / 30))


def test_short_run_as_recorded_and_without_mu_it_is_fedavg(short_runs, tmp_path):
    run, fedavg = short_runs("moon"), short_runs("fedavg")
    plain = short_run("moon", tmp_path, **{"moon-mu": 0.0})
    assert plain["train_loss"] == same_math(fedavg["train_loss"])  # Flower's FedAvg: the same mean, another sum
    assert plain["final_accuracy"] == pytest.approx(fedavg["final_accuracy"])
    assert run["train_loss"] != pytest.approx(fedavg["train_loss"], rel=1e-3)  # the contrastive loss changes training
    assert_as_recorded("moon", run)
