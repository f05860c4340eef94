"""FedLC (Zhang et al. 2022): the calibration and the calibrated loss by hand, one client step by hand,
the counts from the whole training split, the server (FedAvg) with fabricated replies, what it
refuses, and a short run (τ = 0 is FedAvg, up to the order of float sums)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from floats import assert_same_math, same_math

from client_apps.own_loop import algorithm_for
from flower_pfl.engine.client_algorithm import CLIENT_ALGORITHM, LR, ClientAlgorithm, TrainData, train_locally
from flower_pfl.engine.layout import flatten_module
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.engine.minibatches import MinibatchStream
from flower_pfl.engine.reply_checks import RawReply, RoundReplies
from flower_pfl.experiment.models import MLR
from flower_pfl.methods.fedlc import ABSENT, TAU, FedLC, FedLCClient, calibrated_loss, calibration

from .runs import assert_as_recorded, short_run


def test_the_calibration_lowers_rare_classes_more_and_absent_ones_most():
    offsets = calibration(torch.tensor([16, 1, 0]), tau=2.0)
    assert offsets.tolist() == pytest.approx([2.0 * 16 ** -0.25, 2.0, 2.0 * ABSENT ** -0.25])  # 1.0, 2.0, 200.0
    assert calibration(torch.tensor([16, 1, 0]), tau=0.0).tolist() == [0.0, 0.0, 0.0]


def test_the_calibrated_loss_is_the_cross_entropy_of_calibrated_logits_by_hand():
    logits, y, offsets = torch.tensor([[2.0, 0.0, 1.0]]), torch.tensor([1]), torch.tensor([1.0, 2.0, 0.5])
    z = [2.0 - 1.0, 0.0 - 2.0, 1.0 - 0.5]
    by_hand = -(z[1] - math.log(sum(math.exp(v) for v in z)))
    assert float(calibrated_loss(logits, y, offsets)) == pytest.approx(by_hand)


def _data(n: int = 24) -> TrainData:
    torch.manual_seed(3)
    x = torch.randn(n, 4)
    return TrainData(x, torch.tensor([0] * 16 + [1] * 8)[:n])  # class 2 absent


def _config(tau: float = 1.0) -> dict:
    return {CLIENT_ALGORITHM: "fedlc", TAU: tau, LR: 0.1, "local-steps": 3, "batch-size": 8}


def _model(seed: int = 0) -> MLR:
    torch.manual_seed(seed)
    return MLR(4, 3)


def test_the_client_trains_on_the_calibrated_loss_of_its_whole_splits_counts():
    data, config = _data(), _config(0.7)
    model, ref = _model(), _model()
    train_locally(FedLCClient(model, config), model, data, steps=3, lr=0.1, batch_size=8, generator=torch.Generator().manual_seed(5))
    offsets = calibration(torch.tensor([16, 8, 0]), 0.7)  # the whole split's counts, not a minibatch's
    stream = MinibatchStream(len(data.y), 8, torch.Generator().manual_seed(5))
    optimizer = torch.optim.SGD(ref.parameters(), lr=0.1)
    for _ in range(3):
        idx = stream.next()
        optimizer.zero_grad()
        F.cross_entropy(ref(data.x[idx]) - offsets, data.y[idx]).backward()
        optimizer.step()
    assert_same_math(flatten_module(model), flatten_module(ref))
    plain = _model()
    train_locally(ClientAlgorithm(plain, config), plain, data, steps=3, lr=0.1, batch_size=8, generator=torch.Generator().manual_seed(5))
    assert not torch.allclose(flatten_module(model), flatten_module(plain), atol=1e-4)  # the calibration mattered


def test_without_calibration_the_client_is_plain_sgd_and_its_receipt_is_its_name():
    data = _data()
    model, plain = _model(), _model()
    _, extras = train_locally(FedLCClient(model, _config(0.0)), model, data, steps=3, lr=0.1, batch_size=8,
                              generator=torch.Generator().manual_seed(5))
    train_locally(ClientAlgorithm(plain, _config(0.0)), plain, data, steps=3, lr=0.1, batch_size=8,
                  generator=torch.Generator().manual_seed(5))
    assert torch.equal(flatten_module(model), flatten_module(plain)) and extras == {CLIENT_ALGORITHM: "fedlc"}


def test_the_client_needs_the_whole_split_so_a_users_loop_is_refused_and_bad_tau_too():
    with pytest.raises(ValueError, match="client_apps.app"):
        algorithm_for(_config(), _model())
    with pytest.raises(ValueError, match="tau"):
        FedLCClient(_model(), _config(-1.0))
    with pytest.raises(ValueError, match="fedlc-tau"):
        FedLCClient(_model(), {CLIENT_ALGORITHM: "fedlc", LR: 0.1})
    with pytest.raises(ValueError, match="tau"):
        FedLC(tau=-0.5)


def test_the_server_is_fedavg_and_sends_tau_and_the_name():
    arrays = lambda v: {k: torch.full(t.shape, v).numpy() for k, t in _model().state_dict().items()}
    server = MethodServer(FedLC(tau=0.3), clients_per_round=2)
    server.initialize(arrays(0.0))
    plan = server.plan_training(1, [1, 2])
    assert all(ins.config == {CLIENT_ALGORITHM: "fedlc", TAU: 0.3} for ins in plan)
    replies = [server.check(RawReply(i.client_id, list(arrays(float(i.client_id)).values()), None, 10 * i.client_id, {},
                                     {CLIENT_ALGORITHM: "fedlc"})) for i in plan]
    new = server.aggregate(1, replies)
    assert torch.allclose(new, torch.full_like(new, (1 * 10 + 2 * 20) / 30))
    assert server.ignored_algorithm_problem(RoundReplies(accepted=replies)) is None  # the receipts name FedLC's client
    plain = [server.check(RawReply(i.client_id, list(arrays(1.0).values()), None, 10, {})) for i in plan]
    assert "'client-algorithm' = 'fedlc'" in server.ignored_algorithm_problem(RoundReplies(accepted=plain))


def test_short_run_as_recorded_and_without_calibration_it_is_fedavg(short_runs, tmp_path):
    run, fedavg = short_runs("fedlc"), short_runs("fedavg")
    plain = short_run("fedlc", tmp_path, **{"fedlc-tau": 0.0})
    assert plain["train_loss"] == same_math(fedavg["train_loss"])  # Flower's FedAvg: the same mean, another sum
    assert run["train_loss"] != pytest.approx(fedavg["train_loss"], rel=1e-3)  # the calibration changes training
    assert_as_recorded("fedlc", run)
