"""FedProto (Tan et al. 2022): prototypes and their aggregation by hand, the client's steps against
the whole loss written out, the prototypes it returns, the server with fabricated replies (models kept
per client, prototypes weighted by samples), what it refuses, the prototype-distance evaluation on the
ClientApp, the user's own loop, a short run (λ = 0 is Local, up to the order of float sums)."""

from __future__ import annotations

import fabricate as fb
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from batching import LR as BATCH_LR
from batching import assert_together_is_one_by_one
from floats import assert_same_math, same_math
from flwr.app import Context, RecordDict

from client_apps.app import Node
from client_apps.own_loop import algorithm_for
from flower_pfl.engine.batched import unbatched
from flower_pfl.engine.client_algorithm import CLIENT_ALGORITHM, LR, ClientAlgorithm, TrainData, train_locally
from flower_pfl.engine.evaluation import evaluate
from flower_pfl.engine.layout import flatten_module
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.engine.minibatches import MinibatchStream
from flower_pfl.engine.model_split import forward_with_features, head_module
from flower_pfl.engine.reply_checks import RawReply, UpdateRejected
from flower_pfl.engine.wire import encode_vector
from flower_pfl.experiment.config import ExperimentConfig
from flower_pfl.experiment.models import DNN, build_model
from flower_pfl.methods.fedproto import (
    LAMBDA,
    LOCAL_PROTOTYPES,
    PROTOTYPE_ACCURACY,
    PROTOTYPES,
    FedProto,
    FedProtoClient,
    aggregate_prototypes,
    decode_prototypes,
    encode_prototypes,
    prototype_loss,
)

from .features import seeded_dnn, three_classes
from .runs import assert_as_recorded, short_run

C, D = 3, 2  # classes, representation size (DNN(4, 3, hidden=2))


def _data():
    return three_classes(48, 4)


def _model(seed: int = 0) -> DNN:
    return seeded_dnn(4, C, D, seed)


def _train(model, config, steps=4, seed=1):
    x, y = _data()
    return train_locally(FedProtoClient(model, config), model, TrainData(x, y), steps=steps, lr=config[LR], batch_size=8,
                         generator=torch.Generator().manual_seed(seed))


GLOBAL = torch.tensor([[0.5, -0.5], [1.0, 1.0], [0.0, 0.0]])
KNOWN = torch.tensor([True, True, False])


# --- the math, by hand ----------------------------------------------------------------------------

def test_aggregation_weights_each_clients_prototype_by_its_samples_of_the_class():
    weights = torch.tensor([[10.0, 0.0, 5.0], [30.0, 0.0, 0.0]])
    protos = torch.tensor([[[1.0, 0.0], [9.0, 9.0], [2.0, 2.0]], [[5.0, 4.0], [7.0, 7.0], [3.0, 3.0]]])
    mean, known = aggregate_prototypes(weights, protos)
    assert known.tolist() == [True, False, True]
    assert torch.allclose(mean, torch.tensor([[(10 * 1 + 30 * 5) / 40, (30 * 4) / 40], [0.0, 0.0], [2.0, 2.0]]))


def test_prototype_loss_by_hand_and_the_bytes_round_trip():
    z, y = torch.tensor([[1.0, 0.0], [0.0, 3.0], [5.0, 5.0]]), torch.tensor([0, 1, 2])
    by_hand = ((0.5 ** 2 + 0.5 ** 2) / 2 + (1.0 + 4.0) / 2 + 0.0) / 3  # class 2 has no global prototype
    assert float(prototype_loss(z, y, GLOBAL, KNOWN)) == pytest.approx(by_hand)
    weights, protos = decode_prototypes(encode_prototypes(KNOWN.float(), GLOBAL), C, D)
    assert torch.equal(weights, KNOWN.float()) and torch.equal(protos, GLOBAL)


# --- the client -----------------------------------------------------------------------------------

def test_first_round_is_plain_sgd_and_returns_the_class_means_of_the_representation():
    x, y = _data()
    model, ref = _model(), _model()
    _, extras = _train(model, {LR: 0.1, LAMBDA: 1.0})
    stream = MinibatchStream(48, 8, torch.Generator().manual_seed(1))
    sums, counts = torch.zeros(C, D), torch.zeros(C)
    for _ in range(4):  # prototypes: every training sample's representation by the model it was trained with
        idx = stream.next()
        with torch.no_grad():
            z = forward_with_features(ref, x[idx])[1]
        sums.index_add_(0, y[idx], z)
        counts += torch.bincount(y[idx], minlength=C).float()
        train_locally(ClientAlgorithm(ref, {}), ref, TrainData(x[idx], y[idx]), steps=1, lr=0.1, batch_size=8, generator=torch.Generator())
    assert torch.allclose(flatten_module(model), flatten_module(ref), atol=1e-6)  # no global prototypes: no pull
    shares, protos = decode_prototypes(extras[LOCAL_PROTOTYPES], C, D)
    assert torch.allclose(shares, counts / counts.sum()) and torch.allclose(protos, sums / counts.clamp_min(1)[:, None], atol=1e-6)
    assert extras[CLIENT_ALGORITHM] == "fedproto"


def test_with_global_prototypes_each_step_descends_the_whole_loss():
    """w ← w − η ∇(CE + λ mean_n ||f(x_n) − C̄^(y_n)||² / d)."""
    x, y = _data()
    config = {LR: 0.1, LAMBDA: 2.0, PROTOTYPES: encode_prototypes(KNOWN.float(), GLOBAL)}
    model, ref = _model(), _model()
    _train(model, config)
    stream = MinibatchStream(48, 8, torch.Generator().manual_seed(1))
    for _ in range(4):
        idx = stream.next()
        logits, z = forward_with_features(ref, x[idx])
        loss = F.cross_entropy(logits, y[idx]) + 2.0 * ((z - GLOBAL[y[idx]]) ** 2).mean(1).mul(KNOWN[y[idx]]).mean()
        grads = torch.autograd.grad(loss, list(ref.parameters()))
        with torch.no_grad():
            for p, g in zip(ref.parameters(), grads):
                p -= 0.1 * g
    assert torch.allclose(flatten_module(model), flatten_module(ref), atol=1e-6)
    plain = _model()
    _train(plain, {LR: 0.1, LAMBDA: 2.0})
    assert not torch.allclose(flatten_module(model), flatten_module(plain), atol=1e-4)  # the pull has a gradient


def test_users_loop_matches_train_locally():
    x, y = _data()
    config = {LR: 0.1, CLIENT_ALGORITHM: "fedproto", LAMBDA: 1.0, PROTOTYPES: encode_prototypes(KNOWN.float(), GLOBAL)}
    ours, theirs = _model(), _model()
    _, extras = _train(ours, config, seed=3)
    step = algorithm_for(config, theirs, RecordDict(), torch.optim.SGD(theirs.parameters(), lr=0.1))
    their_extras = fb.user_loop(theirs, step, x, y, lr=0.1, batch_size=8, steps=4, seed=3)
    assert_same_math(flatten_module(ours), flatten_module(theirs))
    assert extras[CLIENT_ALGORITHM] == their_extras[CLIENT_ALGORITHM] == "fedproto"
    for a, b in zip(decode_prototypes(extras[LOCAL_PROTOTYPES], C, D), decode_prototypes(their_extras[LOCAL_PROTOTYPES], C, D)):
        assert torch.allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("sent", [False, True], ids=["first-round", "with-prototypes"])
@pytest.mark.parametrize("name", ["dnn", "dnn-bn"])
def test_a_round_s_clients_train_together_as_one_by_one(name, sent):
    """The models, losses and prototypes (their sums and counts carried from step to step) are the same both
    ways, before there are global prototypes and with some (one class without)."""
    model = build_model(name, (6,), 3, seed=0)
    assert unbatched(FedProtoClient, model) is None
    classes, dim = head_module(model).out_features, head_module(model).in_features
    config = {CLIENT_ALGORITHM: "fedproto", LR: BATCH_LR, LAMBDA: 2.0}  # and, after a first round, the prototypes
    if sent:
        prototypes = torch.randn(classes, dim, generator=torch.Generator().manual_seed(7))
        config[PROTOTYPES] = encode_prototypes(torch.tensor([1.0, 1.0, 0.0]), prototypes)

    def same_extras(alone: dict, together: dict) -> None:
        assert together[CLIENT_ALGORITHM] == alone[CLIENT_ALGORITHM] == "fedproto"
        for a, b in zip(decode_prototypes(alone[LOCAL_PROTOTYPES], classes, dim),
                        decode_prototypes(together[LOCAL_PROTOTYPES], classes, dim)):
            assert_same_math(b, a)

    assert_together_is_one_by_one(model, (6,), lambda m, i: FedProtoClient(m, config), same_extras)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="lam"):
        FedProto(lam=-1.0)
    with pytest.raises(ValueError, match="lambda"):
        FedProtoClient(_model(), {LR: 0.1, LAMBDA: -0.5})
    with pytest.raises(ValueError, match="fedproto-prototypes"):
        FedProtoClient(_model(), {LR: 0.1, LAMBDA: 1.0, PROTOTYPES: encode_vector(torch.zeros(4))})
    with pytest.raises(ValueError, match="adjust_gradients"):
        FedProtoClient(_model(), {LR: 0.1, LAMBDA: 1.0}).adjust_gradients(_model())


# --- the server -----------------------------------------------------------------------------------

def _arrays(value: float) -> dict[str, np.ndarray]:
    return {k: np.full(t.shape, value, np.float32) for k, t in _model().state_dict().items()}


def _reply(cid: int, value: float, n: int, shares, protos) -> RawReply:
    a = _arrays(value)
    extras = {LOCAL_PROTOTYPES: encode_prototypes(torch.tensor(shares), torch.tensor(protos))}
    return RawReply(cid, list(a.values()), list(a), n, {}, extras)


def test_server_keeps_models_per_client_and_aggregates_prototypes_by_samples():
    server = MethodServer(FedProto(lam=0.5), clients_per_round=2)
    server.initialize(_arrays(0.0))
    plan = server.plan_training(1, [1, 2])
    assert all(ins.config == {CLIENT_ALGORITHM: "fedproto", LAMBDA: 0.5} for ins in plan)  # no prototypes yet
    assert server.plan_evaluation(1, [1, 2], 1.0)[0].config == {CLIENT_ALGORITHM: "fedproto"}
    replies = [server.check(_reply(1, 1.0, 10, [0.5, 0.5, 0.0], [[1.0, 1.0], [2.0, 0.0], [0.0, 0.0]])),
               server.check(_reply(2, 3.0, 30, [1.0, 0.0, 0.0], [[5.0, 1.0], [0.0, 0.0], [0.0, 0.0]]))]
    server.aggregate(1, replies)
    weights, protos = decode_prototypes(server.plan_training(2, [1, 2])[0].config[PROTOTYPES], C, D)
    assert weights.tolist() == [1.0, 1.0, 0.0]
    assert torch.allclose(protos, torch.tensor([[(5 * 1 + 30 * 5) / 35, 1.0], [2.0, 0.0], [0.0, 0.0]]))  # 5 and 30 samples of class 0
    sent = {ins.client_id: ins for ins in server.plan_evaluation(2, [1, 2, 3], 1.0)}
    assert torch.all(sent[1].model == 1.0) and torch.all(sent[2].model == 3.0) and torch.all(sent[3].model == 0.0)
    assert PROTOTYPES in sent[3].config
    assert torch.equal(server.method.get_state()["prototypes"], protos)


def test_a_class_no_participant_holds_keeps_its_last_global_prototype():
    server = MethodServer(FedProto(), clients_per_round=1)
    server.initialize(_arrays(0.0))
    server.plan_training(1, [1])
    server.aggregate(1, [server.check(_reply(1, 1.0, 10, [0.5, 0.5, 0.0], [[1.0, 1.0], [2.0, 0.0], [0.0, 0.0]]))])
    server.plan_training(2, [2])  # client 2 holds classes 1 and 2 only
    server.aggregate(2, [server.check(_reply(2, 1.0, 10, [0.0, 0.5, 0.5], [[9.0, 9.0], [4.0, 0.0], [0.0, 3.0]]))])
    weights, protos = decode_prototypes(server.plan_training(3, [1])[0].config[PROTOTYPES], C, D)
    assert weights.tolist() == [1.0, 1.0, 1.0]  # class 0 still known, from round 1
    assert torch.equal(protos, torch.tensor([[1.0, 1.0], [4.0, 0.0], [0.0, 3.0]]))  # class 0's round-1 prototype, not client 2's


@pytest.mark.parametrize("extras, reason", [({}, "lacks"), ({LOCAL_PROTOTYPES: b"\x00" * 8}, "expected 9"),
                                            ({LOCAL_PROTOTYPES: encode_vector(torch.full((9,), float("nan")))}, "NaN"),
                                            ({LOCAL_PROTOTYPES: encode_vector(torch.tensor([0.5, 0.2, 0.0, *[0.0] * 6]))}, "sum to 1"),
                                            ({LOCAL_PROTOTYPES: encode_vector(torch.tensor([2.0, -1.0, 0.0, *[0.0] * 6]))}, "shares")])
def test_server_refuses_bad_prototypes(extras, reason):
    server = MethodServer(FedProto(), clients_per_round=1)
    server.initialize(_arrays(0.0))
    server.plan_training(1, [1])
    a = _arrays(1.0)
    with pytest.raises(UpdateRejected, match=reason):
        server.check(RawReply(1, list(a.values()), list(a), 10, {}, extras))


def test_absurd_prototypes_are_refused_against_the_rounds_median():
    server = MethodServer(FedProto(), clients_per_round=3)
    server.initialize(_arrays(0.0))
    plan = server.plan_training(1, [1, 2, 3])
    protos = {1: [[1.0, 1.0]] * 3, 2: [[2.0, 0.0]] * 3, 3: [[1e30, 1e30]] * 3}
    batch = server.receive([_reply(ins.client_id, 0.5, 10, [0.5, 0.5, 0.0], protos[ins.client_id]) for ins in plan])
    assert [r.client_id for r in batch.accepted] == [1, 2]
    assert batch.rejections[0][0] == 3 and "max-median-ratio" in batch.rejections[0][1]


# --- the ClientApp's evaluation -------------------------------------------------------------------

def test_node_reports_the_nearest_prototype_accuracy_beside_the_models():
    context = Context(run_id=1, node_id=5, node_config={"partition-id": 0, "num-partitions": 4}, state=RecordDict(),
                      run_config=ExperimentConfig(model="dnn").to_run_config())
    node = Node.from_context(context)
    x, y = node.data.x_test, node.data.y_test
    with torch.no_grad():
        z = forward_with_features(node.model, x)[1]
    classes = int(node.model.fc2.out_features)
    known = torch.arange(classes) % 2 == 0
    protos = torch.stack([z[y == c].mean(0) if (y == c).any() else torch.zeros(z.shape[1]) for c in range(classes)])
    distances = torch.cdist(z, protos).masked_fill(~known, float("inf"))
    by_hand = float((distances.argmin(1) == y).float().mean())
    metrics = node.evaluate({CLIENT_ALGORITHM: "fedproto", PROTOTYPES: encode_prototypes(known.float(), protos)})
    assert metrics[PROTOTYPE_ACCURACY] == pytest.approx(by_hand)
    assert metrics["accuracy"] == pytest.approx(evaluate(node.model, x, y).accuracy)  # the main figure: the model's output
    assert PROTOTYPE_ACCURACY not in node.evaluate({CLIENT_ALGORITHM: "fedproto"})  # no global prototypes yet
    assert PROTOTYPE_ACCURACY not in node.evaluate({})


# --- a whole run ----------------------------------------------------------------------------------

def test_short_run_as_recorded_and_without_lambda_it_is_local(short_runs, tmp_path):
    run, local = short_runs("fedproto"), short_runs("local")
    plain = short_run("fedproto", tmp_path, **{"fedproto-lambda": 0.0})
    assert plain["train_loss"] == same_math(local["train_loss"])
    assert plain["final_accuracy"] == pytest.approx(local["final_accuracy"])
    assert run["train_loss"] != pytest.approx(local["train_loss"], rel=1e-3)  # the pull toward the prototypes changes training
    assert_as_recorded("fedproto", run)
