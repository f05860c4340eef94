"""kNN-Per: the kNN model and the interpolation by hand, FedAvg on the server, the evaluation the
instructions ask for (in a node, as the ClientApp runs it), bad hyperparameters, a whole run."""

import copy
import math

import fabricate as fb
import numpy as np
import pytest
import torch
from flwr.app import Context, RecordDict

from client_apps.app import Node
from client_apps.own_loop import algorithm_for
from flower_pfl.engine.client_algorithm import CLIENT_ALGORITHM, LR, ClientAlgorithm, TrainData, train_locally
from flower_pfl.engine.evaluation import evaluate
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.engine.reply_checks import RawReply
from flower_pfl.experiment.config import ExperimentConfig
from flower_pfl.experiment.models import DNN, MLR
from flower_pfl.methods.knnper import LAMBDA, SCALE, K, KNNMixture, KNNPer, KNNPerClient, knn_probabilities
from flower_pfl.methods.registry import client_algorithm_for

from .runs import assert_as_recorded


def test_knn_probabilities_by_hand():
    """p_kNN(y | x) ∝ Σ_{N_k(x)} 1[y_j = y] exp(−d_j² / σ): the query 0 has neighbours 0 (label 0,
    d² = 0) and 1 (label 1, d² = 1); the third key (d² = 9) is not among k = 2."""
    keys, labels = torch.tensor([[0.0], [1.0], [3.0]]), torch.tensor([0, 1, 1])
    p = knn_probabilities(torch.tensor([[0.0]]), keys, labels, num_classes=3, k=2, sigma=1.0)
    e = math.exp(-1.0)
    torch.testing.assert_close(p, torch.tensor([[1 / (1 + e), e / (1 + e), 0.0]]))
    p = knn_probabilities(torch.tensor([[0.0]]), keys, labels, num_classes=2, k=3, sigma=2.0)  # all three, σ = 2
    w = torch.tensor([1.0, math.exp(-0.5), math.exp(-4.5)])
    torch.testing.assert_close(p, torch.tensor([[w[0] / w.sum(), (w[1] + w[2]) / w.sum()]]))


def _model_and_data():
    torch.manual_seed(0)
    model = DNN(3, 2, hidden=4)
    x = torch.randn(40, 3, generator=torch.Generator().manual_seed(1))
    return model, TrainData(x, (x[:, 0] * x[:, 1] > 0).long())  # XOR-like: not linearly separable


def test_mixture_interpolates_the_softmax_and_the_knn_model():
    model, train = _model_and_data()
    probs = torch.softmax(model(train.x), dim=1).detach()
    plain = KNNMixture(model, train, k=3, lam=0.0, scale=1.0)
    torch.testing.assert_close(plain(train.x).exp(), probs)  # λ = 0: the global model
    memorized = KNNMixture(model, train, k=1, lam=1.0, scale=1.0)
    assert torch.equal(memorized(train.x).argmax(1), train.y)  # λ = 1, k = 1: every training example is its own neighbour
    half = KNNMixture(model, train, k=5, lam=0.25, scale=2.0)
    feats = torch.relu(model.fc1(train.x)).detach()  # the DNN's representation: the head's input
    knn = knn_probabilities(feats, feats, train.y, 2, 5, 2.0 * 4)  # σ = scale × representation size
    torch.testing.assert_close(half(train.x).exp(), 0.25 * knn + 0.75 * probs)


def test_server_is_fedavg_and_evaluation_asks_for_the_mixture():
    arrays = {"fc.weight": np.zeros((2, 3), np.float32), "fc.bias": np.zeros(2, np.float32)}
    server = MethodServer(KNNPer(k=3, lam=0.3, scale=0.5), clients_per_round=2)
    server.initialize(arrays)
    plan = server.plan_training(1, [1, 2, 3])
    assert all(ins.config == {CLIENT_ALGORITHM: "knnper", K: 3} and client_algorithm_for(ins.config) is KNNPerClient
               for ins in plan)  # plain SGD and its receipt
    replies = [server.check(RawReply(ins.client_id, [np.full((2, 3), v, np.float32), np.full(2, v, np.float32)], None, n, {}))
               for ins, v, n in zip(plan, (1.0, 3.0), (1, 3))]
    new = server.aggregate(1, replies)
    torch.testing.assert_close(new, torch.full((8,), 0.25 * 1.0 + 0.75 * 3.0))  # FedAvg, by hand: 2.5
    evaluation = server.plan_evaluation(1, [1, 2, 3], 1.0)
    assert all(ins.config == {CLIENT_ALGORITHM: "knnper", K: 3, LAMBDA: 0.3, SCALE: 0.5} and torch.equal(ins.model, new)
               for ins in evaluation)
    assert client_algorithm_for(evaluation[0].config) is KNNPerClient


def test_evaluation_model_reports_the_global_models_accuracy_beside():
    _, train = _model_and_data()
    torch.manual_seed(0)
    model = MLR(3, 2)  # its representation is the input itself
    test = TrainData(train.x + 0.01, train.y)
    mixed, extra = KNNPerClient.evaluation_model(model, {K: 1, LAMBDA: 1.0, SCALE: 1.0}, None, train,
                                               lambda m: evaluate(m, test.x, test.y))
    assert isinstance(mixed, KNNMixture)
    assert extra["global-accuracy"] == evaluate(model, test.x, test.y).accuracy < 1.0
    assert evaluate(mixed, test.x, test.y).accuracy == 1.0  # the test points sit next to their training twins
    with pytest.raises(ValueError, match="kNN-Per needs"):
        KNNPerClient.evaluation_model(model, {K: 0, LAMBDA: 0.5, SCALE: 1.0}, None, train, lambda m: None)


def test_a_node_evaluates_the_mixture_and_the_global_model():
    context = Context(run_id=1, node_id=3, node_config={"partition-id": 2, "num-partitions": 4}, state=RecordDict(),
                      run_config=ExperimentConfig(model="dnn").to_run_config())
    node = Node.from_context(context)
    plain = node.evaluate({})
    mixed = node.evaluate({CLIENT_ALGORITHM: "knnper", **KNNPer().evaluation_config()})
    assert mixed["global-accuracy"] == plain["accuracy"] != mixed["accuracy"]
    assert 0 <= mixed["accuracy"] <= 1 and mixed["loss"] > 0


def test_training_is_plain_sgd_with_the_receipt_in_a_users_loop_too():
    model, train = _model_and_data()
    theirs, plain = copy.deepcopy(model), copy.deepcopy(model)
    config = {LR: 0.1, CLIENT_ALGORITHM: "knnper", K: 5}
    _, extras = train_locally(client_algorithm_for(config)(model, config), model, train, steps=2, lr=0.1, batch_size=8,
                              generator=torch.Generator().manual_seed(3))
    train_locally(ClientAlgorithm(plain, config), plain, train, steps=2, lr=0.1, batch_size=8, generator=torch.Generator().manual_seed(3))
    their_extras = fb.user_loop(theirs, algorithm_for(config, theirs, None, torch.optim.SGD(theirs.parameters(), lr=0.1)),
                                train.x, train.y, lr=0.1, batch_size=8, steps=2, seed=3)
    assert extras == their_extras == {CLIENT_ALGORITHM: "knnper"}
    for a, b, c in zip(model.parameters(), plain.parameters(), theirs.parameters()):
        assert torch.equal(a, b)
        torch.testing.assert_close(a, c)


@pytest.mark.parametrize("bad", [{"k": 0}, {"lam": 1.5}, {"lam": -0.1}, {"scale": 0.0}])
def test_bad_hyperparameters_are_refused(bad):
    with pytest.raises(ValueError, match=f"{next(iter(bad))} = .* is invalid"):
        KNNPer(**bad)


def test_short_run_as_recorded_and_memorization_beats_fedavg(short_runs):
    knnper = short_runs("knnper")
    assert knnper["bmta"] > short_runs("fedavg")["bmta"] + 0.4  # observed 0.876 vs 0.306: the same global model, plus kNN
    assert_as_recorded("knnper", knnper)
