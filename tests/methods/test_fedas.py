"""FedAS (Yang et al. 2024): the prototypes, the alignment loss and the Fisher traces by hand, the client's
alignment and training against the steps written out, the server with fabricated replies (bodies
weighted by the traces, models kept per client), what it refuses, and short runs (without alignment
and Fisher weights it trains as FedPer, up to the order of float sums)."""

from __future__ import annotations

import fabricate as fb
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from floats import same_math

from client_apps.own_loop import algorithm_for
from flower_pfl.engine.client_algorithm import BATCH_SIZE, CLIENT_ALGORITHM, LR, ClientAlgorithm, TrainData, train_locally
from flower_pfl.engine.layout import flatten_module, load_flat_
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.engine.minibatches import MinibatchStream
from flower_pfl.engine.reply_checks import RawReply, UpdateRejected
from flower_pfl.engine.wire import decode_flat, encode_vector
from flower_pfl.experiment.models import DNN, MLR
from flower_pfl.methods.fedas import (
    ALIGN_BATCH,
    ALIGN_EPOCHS,
    ALIGN_LR,
    FISHER,
    GLOBAL_BODY,
    FedAS,
    FedASClient,
    alignment_loss,
    class_prototypes,
    fisher_traces,
)

from .runs import assert_as_recorded, short_run

BODY = 10  # DNN(4, 3, hidden=2): fc1's weight and bias


def _model(seed: int = 0) -> DNN:
    torch.manual_seed(seed)
    return DNN(4, 3, hidden=2)


def _data(n: int = 20) -> TrainData:
    x = torch.randn(n, 4, generator=torch.Generator().manual_seed(0))
    return TrainData(x, (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long())


def _config(global_body: torch.Tensor, lr: float = 0.1, epochs: int = 1, batch: int = 8) -> dict:
    return {CLIENT_ALGORITHM: "fedas", ALIGN_LR: lr, ALIGN_EPOCHS: epochs, ALIGN_BATCH: batch,
            GLOBAL_BODY: encode_vector(global_body), LR: 0.05, BATCH_SIZE: 6}


# --- the math, by hand ----------------------------------------------------------------------------

def test_prototypes_are_class_means_and_the_alignment_loss_sums_each_classs_mean_squared_error():
    z, y = torch.tensor([[1.0, 0.0], [3.0, 2.0], [5.0, 5.0]]), torch.tensor([0, 0, 2])
    protos, present = class_prototypes(z, y, 3)
    assert protos.tolist() == [[2.0, 1.0], [0.0, 0.0], [5.0, 5.0]] and present.tolist() == [True, False, True]
    targets, known = torch.tensor([[1.0, 1.0], [0.0, 0.0], [4.0, 3.0]]), torch.tensor([True, False, True])
    by_hand = ((0.0 + 1.0) / 2 + (4.0 + 1.0) / 2) / 2 + ((1.0 + 4.0) / 2) / 1  # class 0: two samples, class 2: one
    assert float(alignment_loss(z, y, targets, known)) == pytest.approx(by_hand)
    assert float(alignment_loss(z, y, targets, torch.tensor([True, False, False]))) == pytest.approx(1.5)  # no prototype: no term


def test_fisher_traces_are_the_mean_squared_gradients_of_each_batchs_nll_by_hand():
    torch.manual_seed(1)
    model, data = MLR(4, 3), _data(10)
    traces = fisher_traces(model, data, batch_size=4)
    weight, bias = torch.zeros(()), torch.zeros(())
    for start in (0, 4, 8):  # batches of 4, 4 and 2: ∇_W = (softmax − onehot)ᵀ x / n, ∇_b = mean(softmax − onehot)
        x, y = data.x[start:start + 4], data.y[start:start + 4]
        with torch.no_grad():
            error = torch.softmax(model(x), 1) - F.one_hot(y, 3)
        weight += ((error.T @ x / len(y)) ** 2).sum()
        bias += (error.mean(0) ** 2).sum()
    assert torch.allclose(traces, torch.stack([weight, bias]) / 3, rtol=1e-5)  # a mean over the 3 batches
    twice = TrainData(torch.cat([data.x[:8]] * 2), torch.cat([data.y[:8]] * 2))  # more data, same batches
    assert torch.allclose(fisher_traces(model, twice, 4), fisher_traces(model, TrainData(data.x[:8], data.y[:8]), 4))


# --- the client -----------------------------------------------------------------------------------

def _aligned_by_hand(own: DNN, global_body: torch.Tensor, data: TrainData, lr: float, epochs: int, batch: int) -> DNN:
    """The global body with ``own``'s head, after the alignment's SGD on the body, written out."""
    with torch.no_grad():
        z = torch.relu(own.fc1(data.x))
    protos = torch.stack([z[data.y == c].mean(0) for c in range(3)])
    ref = _model()
    flat = flatten_module(own)
    flat[:BODY] = global_body
    load_flat_(ref, flat)
    for _ in range(epochs):
        for start in range(0, len(data.y), batch):
            x, y = data.x[start:start + batch], data.y[start:start + batch]
            feats = torch.relu(ref.fc1(x))
            loss = sum(F.mse_loss(feats[y == c], protos[c].expand_as(feats[y == c])) for c in y.unique().tolist())
            grads = torch.autograd.grad(loss, [ref.fc1.weight, ref.fc1.bias])
            with torch.no_grad():
                ref.fc1.weight -= lr * grads[0]
                ref.fc1.bias -= lr * grads[1]
    return ref


def test_the_client_aligns_the_global_body_to_its_own_prototypes_then_trains_and_returns_fisher_traces():
    data, own, global_body = _data(), _model(0), flatten_module(_model(7))[:BODY]
    model = _model(0)
    _, extras = train_locally(FedASClient(model, _config(global_body, lr=0.3, epochs=2)), model, data, steps=3, lr=0.05,
                              batch_size=6, generator=torch.Generator().manual_seed(2))
    ref = _aligned_by_hand(own, global_body, data, lr=0.3, epochs=2, batch=8)
    assert not torch.allclose(flatten_module(ref)[:BODY], global_body, atol=1e-3)  # the alignment moved the body
    assert torch.equal(flatten_module(ref)[BODY:], flatten_module(own)[BODY:])  # the client's own head
    stream, optimizer = MinibatchStream(20, 6, torch.Generator().manual_seed(2)), torch.optim.SGD(ref.parameters(), lr=0.05)
    for _ in range(3):
        idx = stream.next()
        optimizer.zero_grad()
        F.cross_entropy(ref(data.x[idx]), data.y[idx]).backward()
        optimizer.step()
    assert torch.allclose(flatten_module(model), flatten_module(ref), atol=1e-6)
    assert extras[CLIENT_ALGORITHM] == "fedas"
    assert torch.allclose(decode_flat(extras[FISHER], 4), fisher_traces(ref, data, 6), rtol=1e-4)


def test_without_alignment_the_client_trains_the_global_body_with_its_own_head():
    data, global_body = _data(), flatten_module(_model(7))[:BODY]
    model, plain = _model(0), _model(0)
    train_locally(FedASClient(model, _config(global_body, epochs=0)), model, data, steps=3, lr=0.05, batch_size=6,
                  generator=torch.Generator().manual_seed(2))
    flat = flatten_module(plain)
    flat[:BODY] = global_body
    load_flat_(plain, flat)
    train_locally(ClientAlgorithm(plain, {}), plain, data, steps=3, lr=0.05, batch_size=6, generator=torch.Generator().manual_seed(2))
    assert torch.equal(flatten_module(model), flatten_module(plain))


def test_the_client_needs_the_whole_split_so_a_users_loop_is_refused_and_bad_settings_too():
    body = torch.zeros(BODY)
    with pytest.raises(ValueError, match="client_apps.app"):
        algorithm_for(_config(body), _model())
    with pytest.raises(ValueError, match="client_apps.app"):
        FedASClient(_model(), _config(body)).finish(_model(), _data().x)  # no begin: no labels for the traces
    with pytest.raises(ValueError, match="alignment lr > 0"):
        FedASClient(_model(), _config(body, lr=0.0))
    with pytest.raises(ValueError, match="fedas-global-body"):
        FedASClient(_model(), _config(torch.zeros(BODY + 1)))
    with pytest.raises(ValueError, match="fedas-alignment-lr"):
        FedASClient(_model(), {k: v for k, v in _config(body).items() if k != ALIGN_LR})
    for bad in ({"align_lr": 0.0}, {"align_epochs": -1}, {"align_batch": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            FedAS(**bad)
    assert "one layer" in FedAS.check_model(fb.facts("mlr")) and FedAS.check_model(fb.facts("dnn")) is None


# --- the server -----------------------------------------------------------------------------------

def _arrays(value: float) -> dict[str, np.ndarray]:
    return {k: np.full(t.shape, value, np.float32) for k, t in _model().state_dict().items()}


def _reply(cid: int, arrays: dict[str, np.ndarray], n: int, traces: list[float]) -> RawReply:
    return RawReply(cid, list(arrays.values()), list(arrays), n, {}, {FISHER: encode_vector(torch.tensor(traces))})


def test_server_sends_each_client_its_own_model_and_the_global_body_weighted_by_fisher_traces():
    server = MethodServer(FedAS(align_lr=0.02, align_epochs=2, align_batch=4), clients_per_round=2)
    server.initialize(_arrays(0.0))
    plan = server.plan_training(1, [1, 2])
    assert {k: v for k, v in plan[0].config.items() if k != GLOBAL_BODY} == {
        CLIENT_ALGORITHM: "fedas", ALIGN_LR: 0.02, ALIGN_EPOCHS: 2, ALIGN_BATCH: 4}
    assert torch.equal(decode_flat(plan[0].config[GLOBAL_BODY], BODY), torch.zeros(BODY))
    replies = [server.check(_reply(1, _arrays(1.0), 10, [1.0, 0.5, 0.0, 0.5])),   # tr(F_1) = 2, n_1 = 10
               server.check(_reply(2, _arrays(4.0), 30, [3.0, 2.0, 1.0, 1.0]))]   # tr(F_2) = 7, n_2 = 30
    server.aggregate(1, replies)
    sent = {ins.client_id: ins for ins in server.plan_training(2, [1, 2])}
    expected = (20 * 1.0 + 210 * 4.0) / 230  # n_i tr(F_i), not the sample counts alone (which would give 3.25)
    assert torch.allclose(decode_flat(sent[1].config[GLOBAL_BODY], BODY), torch.full((BODY,), expected))
    assert torch.all(sent[1].model == 1.0) and torch.all(sent[2].model == 4.0)  # their own models
    evaluated = {ins.client_id: ins.model for ins in server.plan_evaluation(2, [1, 2, 3], 1.0)}
    assert torch.all(evaluated[1] == 1.0) and torch.all(evaluated[2] == 4.0)  # the models they trained
    assert torch.all(evaluated[3] == 0.0) and GLOBAL_BODY not in server.plan_evaluation(2, [3], 1.0)[0].config


@pytest.mark.parametrize("fisher_weights, traces", [(False, [1.0, 6.0]), (True, [0.0, 0.0])])
def test_sample_counts_weigh_the_bodies_without_fisher_weights_or_when_every_trace_is_zero(fisher_weights, traces):
    server = MethodServer(FedAS(fisher_weights=fisher_weights), clients_per_round=2)
    server.initialize(_arrays(0.0))
    server.plan_training(1, [1, 2])
    server.aggregate(1, [server.check(_reply(1, _arrays(1.0), 10, [traces[0], 0, 0, 0])),
                         server.check(_reply(2, _arrays(4.0), 30, [traces[1], 0, 0, 0]))])
    body = decode_flat(server.plan_training(2, [1])[0].config[GLOBAL_BODY], BODY)
    assert torch.allclose(body, torch.full((BODY,), (10 * 1.0 + 30 * 4.0) / 40))


@pytest.mark.parametrize("extras, reason", [({}, "lacks"), ({FISHER: encode_vector(torch.ones(3))}, "expected 4"),
                                            ({FISHER: encode_vector(torch.tensor([1.0, float("nan"), 0, 0]))}, "NaN"),
                                            ({FISHER: encode_vector(torch.tensor([1.0, -0.5, 0, 0]))}, "negative")])
def test_server_refuses_bad_fisher_traces(extras, reason):
    server = MethodServer(FedAS(), clients_per_round=1)
    server.initialize(_arrays(0.0))
    server.plan_training(1, [1])
    a = _arrays(1.0)
    with pytest.raises(UpdateRejected, match=reason):
        server.check(RawReply(1, list(a.values()), list(a), 10, {}, extras))


# --- a whole run ----------------------------------------------------------------------------------

def test_short_run_as_recorded_and_without_alignment_and_fisher_weights_it_trains_as_fedper(short_runs, tmp_path):
    run, fedper = short_runs("fedas"), short_runs("fedper")
    plain = short_run("fedas", tmp_path / "plain", **{"fedas-alignment-epochs": 0, "fedas-fisher-weights": False})
    assert plain["train_loss"] == same_math(fedper["train_loss"])  # the global body and the own head, sample-weighted
    fisher = short_run("fedas", tmp_path / "fisher", **{"fedas-alignment-epochs": 0})
    assert fisher["train_loss"][0] == same_math(fedper["train_loss"][0])
    assert fisher["train_loss"][1:] != pytest.approx(fedper["train_loss"][1:], rel=1e-4)  # the traces weigh the bodies
    assert run["train_loss"] != pytest.approx(fisher["train_loss"], rel=1e-4)  # the alignment changes training
    assert_as_recorded("fedas", run)
