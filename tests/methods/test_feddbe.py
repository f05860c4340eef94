"""FedDBE: MR and the shifted representation by hand, the first round's plain steps and running mean, a
step with PRBM and MR by hand (nothing sent but the model then), the kept PRBM and its evaluation, a round's
clients trained together as one by one (in one group, both phases), FedAvg and the consensus (once) on the
server with fabricated replies, what it refuses, a short run (its first round is FedAvg's)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from batching import BATCH, assert_together_is_one_by_one, clients, load
from batching import LR as BATCH_LR
from floats import assert_same_math, same_math
from flwr.app import RecordDict

from client_apps.own_loop import algorithm_for
from flower_pfl.engine.batched import _settings, unbatched
from flower_pfl.engine.client_algorithm import CLIENT_ALGORITHM, LR, TrainData, train_locally
from flower_pfl.engine.layout import flatten_module
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.engine.minibatches import MinibatchStream
from flower_pfl.engine.model_split import head_module
from flower_pfl.engine.reply_checks import RawReply, UpdateRejected
from flower_pfl.engine.wire import decode_flat, encode_vector
from flower_pfl.experiment.models import DNN, build_model
from flower_pfl.methods.feddbe import (
    CONSENSUS,
    KAPPA,
    MOMENTUM,
    PRBM,
    RUNNING_MEAN,
    FedDBE,
    FedDBEClient,
    Shifted,
    forward_shifted,
    mean_regularization,
)

from .features import seeded_dnn, three_classes
from .runs import assert_as_recorded

C, D = 3, 2  # classes, representation size (DNN(4, 3, hidden=2))


def _data():
    return three_classes(40, 4)


def _model(seed: int = 0) -> DNN:
    return seeded_dnn(4, C, D, seed)


def _train(model, config, state, steps=3):
    x, y = _data()
    return train_locally(FedDBEClient(model, config, state), model, TrainData(x, y), steps=steps, lr=config[LR], batch_size=8,
                         generator=torch.Generator().manual_seed(1))


CONFIG = {LR: 0.1, KAPPA: 2.0, MOMENTUM: 0.5}
G = torch.tensor([0.3, -0.2])  # a consensus


def test_mean_regularization_and_the_shifted_head_by_hand():
    assert float(mean_regularization(torch.tensor([1.0, 3.0]), torch.tensor([0.0, 1.0]), 4.0)) == pytest.approx(4 * (0.5 * 1 + 0.5 * 4) / 2)
    model, x = _model(), torch.randn(5, 4)
    shift = torch.tensor([0.5, -1.0])
    logits, z = forward_shifted(model, x, shift)
    with torch.no_grad():
        plain = torch.relu(model.fc1(x))
    torch.testing.assert_close(z, plain)
    torch.testing.assert_close(logits, model.fc2(plain + shift))
    torch.testing.assert_close(Shifted(model, shift)(x), logits)
    torch.testing.assert_close(forward_shifted(model, x, None)[0], model(x))


def test_first_round_is_plain_sgd_and_returns_its_running_mean():
    """The running mean of the minibatch representations, each taken before its step: m·mean f(x) + (1 − m)·previous, from 0."""
    x, y = _data()
    model, ref, state = _model(), _model(), {}
    _, extras = _train(model, CONFIG, state)
    running, stream = torch.zeros(D), MinibatchStream(40, 8, torch.Generator().manual_seed(1))
    for _ in range(3):
        idx = stream.next()
        z = torch.relu(ref.fc1(x[idx]))
        running = 0.5 * running + 0.5 * z.mean(0).detach()
        grads = torch.autograd.grad(F.cross_entropy(ref.fc2(z), y[idx]), list(ref.parameters()))
        with torch.no_grad():
            for p, g in zip(ref.parameters(), grads):
                p -= 0.1 * g
    torch.testing.assert_close(flatten_module(model), flatten_module(ref))
    torch.testing.assert_close(decode_flat(extras[RUNNING_MEAN], D), running)
    assert torch.equal(state[PRBM][0], torch.zeros(D)) and extras[CLIENT_ALGORITHM] == "feddbe"


def test_with_a_consensus_each_step_trains_model_and_prbm_on_ce_plus_mr():
    """Two steps by hand: the running mean m·mean f(x) + (1 − m)·previous (from 0, previous held fixed)."""
    x, y = _data()
    config = {**CONFIG, CONSENSUS: encode_vector(G)}
    model, ref = _model(), _model()
    state = {PRBM: [torch.tensor([0.1, 0.2])]}
    _, extras = _train(model, config, state, steps=2)
    assert RUNNING_MEAN not in extras  # the server has its consensus: the model alone
    prbm, running = torch.tensor([0.1, 0.2]), torch.zeros(D)
    stream = MinibatchStream(40, 8, torch.Generator().manual_seed(1))
    for _ in range(2):
        idx = stream.next()
        b = prbm.clone().requires_grad_(True)
        z = torch.relu(ref.fc1(x[idx]))
        new_running = 0.5 * running + 0.5 * z.mean(0)
        loss = F.cross_entropy(ref.fc2(z + b), y[idx]) + 2.0 * (0.5 * (new_running - G) ** 2).mean()
        grads = torch.autograd.grad(loss, [*ref.parameters(), b])
        with torch.no_grad():
            for p, g in zip(ref.parameters(), grads):
                p -= 0.1 * g
        prbm, running = (b - 0.1 * grads[-1]).detach(), new_running.detach()
    torch.testing.assert_close(flatten_module(model), flatten_module(ref))
    torch.testing.assert_close(state[PRBM][0], prbm)


def test_evaluation_adds_the_kept_prbm():
    model, x = _model(), torch.randn(6, 4)
    evaluated, extra = FedDBEClient.evaluation_model(model, {}, {PRBM: [torch.tensor([1.0, -1.0])]}, TrainData(x, x[:, 0].long()), None)
    torch.testing.assert_close(evaluated(x), model.fc2(torch.relu(model.fc1(x)) + torch.tensor([1.0, -1.0])))
    evaluated, _ = FedDBEClient.evaluation_model(model, {}, {}, TrainData(x, x[:, 0].long()), None)
    torch.testing.assert_close(evaluated(x), model(x))  # no PRBM yet: the model itself
    assert extra == {}


def test_the_client_needs_the_package_loop_and_good_settings():
    with pytest.raises(ValueError, match="ClientApp"):
        algorithm_for({**CONFIG, CLIENT_ALGORITHM: "feddbe"}, _model(), RecordDict())
    with pytest.raises(ValueError, match="state"):
        FedDBEClient(_model(), CONFIG)
    with pytest.raises(ValueError, match="kappa"):
        FedDBEClient(_model(), {**CONFIG, KAPPA: -1.0}, {})
    with pytest.raises(ValueError, match="momentum"):
        FedDBEClient(_model(), {**CONFIG, MOMENTUM: 0.0}, {})
    with pytest.raises(ValueError, match="feddbe-consensus"):
        FedDBEClient(_model(), {**CONFIG, CONSENSUS: encode_vector(torch.zeros(5))}, {})
    with pytest.raises(ValueError, match="kappa = -1.0 is invalid"):
        FedDBE(kappa=-1.0)
    for momentum in (0.0, 1.5):
        with pytest.raises(ValueError, match="momentum"):
            FedDBE(momentum=momentum)


@pytest.mark.parametrize("consensus", [False, True], ids=["first-round", "later-round"])
@pytest.mark.parametrize("name", ["dnn", "dnn-bn"])
def test_a_round_s_clients_train_together_as_one_by_one(name, consensus):
    """The first round (plain steps, the running means sent) and a later one (each client's own PRBM from its first
    round, the first client's zeros, trained with MR toward the consensus): the models, losses, running means sent
    and PRBMs kept are the same both ways, and a round's clients, whatever their PRBMs, are one group."""
    model = build_model(name, (6,), 3, seed=0)
    assert unbatched(FedDBEClient, model) is None
    dim = head_module(model).in_features
    config = {**CONFIG, LR: BATCH_LR}
    datas, starts = clients(model, (6,))
    firsts: list[dict] = [{} for _ in datas]
    for i in range(1, len(datas)):
        first = copy.deepcopy(model)
        load(first, starts[i])
        train_locally(FedDBEClient(first, {**config, CONSENSUS: encode_vector(torch.full((dim,), 0.1))}, firsts[i]), first,
                      datas[i], steps=3, lr=BATCH_LR, batch_size=BATCH, generator=torch.Generator().manual_seed(10 + i))
    if consensus:
        config[CONSENSUS] = encode_vector(torch.linspace(-0.5, 0.5, dim))
    made: list[tuple[dict, FedDBEClient]] = []

    def make(m, i):
        state = dict(firsts[i])
        made.append((state, FedDBEClient(m, config, state)))
        return made[-1][1]

    def same_extras(alone, together):
        assert alone.keys() == together.keys() == ({CLIENT_ALGORITHM} if consensus else {CLIENT_ALGORITHM, RUNNING_MEAN})
        if not consensus:
            assert_same_math(decode_flat(together[RUNNING_MEAN], dim), decode_flat(alone[RUNNING_MEAN], dim))

    assert_together_is_one_by_one(model, (6,), make, same_extras)
    n = len(datas)
    assert len(made) == 2 * n and len({_settings(algorithm) for _, algorithm in made}) == 1
    for (alone, _), (together, _) in zip(made[:n], made[n:]):
        assert_same_math(together[PRBM][0], alone[PRBM][0])
    moved = [not torch.equal(made[i][0][PRBM][0], firsts[i].get(PRBM, [torch.zeros(dim)])[0]) for i in range(n)]
    assert moved == [consensus] * n  # the PRBM trains only with the consensus


# --- the server -----------------------------------------------------------------------------------

def _arrays(value: float) -> dict[str, np.ndarray]:
    return {k: np.full(t.shape, value, np.float32) for k, t in _model().state_dict().items()}


def _reply(cid, value, n, running, extras=None):
    a = _arrays(value)
    return RawReply(cid, list(a.values()), list(a), n, {}, {RUNNING_MEAN: encode_vector(torch.tensor(running))} if extras is None else extras)


def test_server_is_fedavg_and_sets_the_consensus_once_from_the_first_rounds_running_means():
    server = MethodServer(FedDBE(kappa=3.0, momentum=0.2), clients_per_round=2)
    server.initialize(_arrays(0.0))
    plan = server.plan_training(1, [1, 2])
    assert all(ins.config == {CLIENT_ALGORITHM: "feddbe", KAPPA: 3.0, MOMENTUM: 0.2} for ins in plan)  # no consensus yet
    new = server.aggregate(1, [server.check(_reply(1, 1.0, 10, [2.0, 1.0])), server.check(_reply(2, 3.0, 30, [4.0, 4.0]))])
    assert torch.allclose(new, torch.full_like(new, 2.5))  # FedAvg by samples
    consensus = torch.tensor([(10 * 2.0 + 30 * 4.0) / 40, (10 * 1.0 + 30 * 4.0) / 40])  # by samples
    sent = server.plan_training(2, [1, 3])
    assert all(torch.allclose(decode_flat(ins.config[CONSENSUS], D), consensus) for ins in sent)
    # later replies carry the model alone (a running mean sent anyway is not read, nor refused)
    assert server.check(_reply(4, 2.0, 10, None, extras={RUNNING_MEAN: b"junk"})).extras is None
    new = server.aggregate(2, [server.check(_reply(3, 1.0, 10, [9.0, 9.0])), server.check(_reply(1, 4.0, 30, None, extras={}))])
    assert torch.allclose(new, torch.full_like(new, 3.25))
    assert torch.allclose(decode_flat(server.plan_training(3, [1])[0].config[CONSENSUS], D), consensus)  # fixed after round 1
    assert server.plan_evaluation(3, [1], 1.0)[0].config == {CLIENT_ALGORITHM: "feddbe"}
    assert torch.equal(server.method.get_state()["consensus"], server.method.consensus)


@pytest.mark.parametrize("extras, reason", [({}, "lacks 'feddbe-running-mean'"), ({RUNNING_MEAN: b"\x00" * 12}, "expected 2"),
                                            ({RUNNING_MEAN: encode_vector(torch.tensor([0.0, float("nan")]))}, "NaN")])
def test_server_refuses_a_bad_running_mean(extras, reason):
    server = MethodServer(FedDBE(), clients_per_round=1)
    server.initialize(_arrays(0.0))
    server.plan_training(1, [1])
    with pytest.raises(UpdateRejected, match=reason):
        server.check(_reply(1, 1.0, 10, None, extras))


# --- a whole run ----------------------------------------------------------------------------------

def test_short_run_as_recorded_its_first_round_is_fedavg_and_dbe_changes_the_rest(short_runs):
    run, fedavg = short_runs("feddbe"), short_runs("fedavg")
    assert run["train_loss"][0] == same_math(fedavg["train_loss"][0])  # no consensus in round 1: plain FedAvg
    assert run["train_loss"][1:] != pytest.approx(fedavg["train_loss"][1:], rel=1e-3)
    assert run["bmta"] > fedavg["bmta"]  # observed 0.390 vs 0.306
    assert_as_recorded("feddbe", run)
