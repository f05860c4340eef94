"""IFCA: the cluster estimate (on the whole training split, in ``begin``) and the client's training by hand,
the server's per-cluster averages with fabricated replies, the checks on the cluster identity, the evaluation's choice, bad
hyperparameters and a whole run."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from client_apps.own_loop import algorithm_for
from flower_pfl.engine.client_algorithm import CLIENT_ALGORITHM, LOCAL_STEPS, LR, ClientAlgorithm, TrainData, train_locally
from flower_pfl.engine.layout import ParamLayout, flatten_module, load_flat_
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.engine.minibatches import MinibatchStream
from flower_pfl.engine.reply_checks import AlgorithmOutputMissing, RawReply, UpdateRejected
from flower_pfl.engine.wire import decode_flat, encode_vector
from flower_pfl.experiment.models import MLR
from flower_pfl.methods.ifca import CLUSTER, IFCA, MODELS, IFCAClient, choose_cluster, cluster_losses, initial_clusters
from flower_pfl.methods.registry import client_algorithm_for

from .runs import assert_as_recorded

D = 8  # MLR(3, 2): fc.weight (2, 3) + fc.bias (2)


def _data():
    x = torch.randn(40, 3, generator=torch.Generator().manual_seed(0))
    return TrainData(x, (x[:, 0] > 0).long())


def _models() -> torch.Tensor:
    """Cluster 0 predicts the labels of ``_data`` (x_0 > 0 -> class 1), cluster 1 their opposite."""
    good = torch.tensor([-3.0, 0, 0, 3.0, 0, 0, 0, 0])
    return torch.stack([good, -good])


def test_cluster_estimate_is_the_lowest_mean_loss_by_hand():
    data, model = _data(), MLR(3, 2)
    losses = cluster_losses(_models(), model, [(data.x[:20], data.y[:20]), (data.x[20:], data.y[20:])])
    for j, theta in enumerate(_models()):  # F_i(θ_j): the mean cross-entropy over all 40 examples
        load_flat_(model, theta)
        torch.testing.assert_close(losses[j], F.cross_entropy(model(data.x), data.y).detach(), rtol=1e-6, atol=1e-6)
    assert choose_cluster(_models().flip(0), model, [(data.x, data.y)]) == 1  # ĵ = argmin_j F_i(θ_j), left loaded
    torch.testing.assert_close(flatten_module(model), _models()[0])


def test_client_trains_the_chosen_cluster_on_the_very_minibatches_plain_sgd_would_use():
    data, lr = _data(), 0.1
    config = {LR: lr, LOCAL_STEPS: 3, CLIENT_ALGORITHM: "ifca", MODELS: encode_vector(_models().flip(0).flatten())}  # good: cluster 1
    model = MLR(3, 2)
    assert client_algorithm_for(config) is IFCAClient
    _, extras = train_locally(IFCAClient(model, config), model, data, steps=3, lr=lr, batch_size=8,
                              generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(decode_flat(extras[CLUSTER], 2), torch.tensor([0.0, 1.0]))  # s_i, one-hot
    assert extras[CLIENT_ALGORITHM] == "ifca"
    plain = MLR(3, 2)
    load_flat_(plain, _models()[0])
    train_locally(ClientAlgorithm(plain, config), plain, data, steps=3, lr=lr, batch_size=8, generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(flatten_module(model), flatten_module(plain))  # LocalUpdate(θ_ĵ), same minibatches
    with pytest.raises(ValueError, match="second model or takes a second minibatch"):
        algorithm_for(config, MLR(3, 2))  # the choice is made in begin, which a user's loop does not call


def test_cluster_is_chosen_on_the_whole_split_where_the_first_minibatch_would_choose_another():
    """The first minibatch's 8 labels are flipped: on it the opposite model θ_1 has the lower loss, on all
    40 examples (32 right for θ_0) θ_0 has; ``begin`` picks θ_0, loads it, and the steps train it."""
    x, lr = _data().x, 0.1
    first = MinibatchStream(40, 8, torch.Generator().manual_seed(4)).next()  # the round's first minibatch
    y = (x[:, 0] > 0).long()
    y[first] = 1 - y[first]
    data, model, probe = TrainData(x, y), MLR(3, 2), MLR(3, 2)

    def loss(theta, xs, ys):
        load_flat_(probe, theta)
        return float(F.cross_entropy(probe(xs), ys))

    on_batch = [loss(t, x[first], y[first]) for t in _models()]
    on_split = [loss(t, x, y) for t in _models()]
    assert on_batch[1] < on_batch[0] and on_split[0] < on_split[1]  # the two estimates disagree
    config = {LR: lr, LOCAL_STEPS: 1, MODELS: encode_vector(_models().flatten())}
    step = IFCAClient(model, config)
    assert step.begin(model, data) is data  # trains on the whole split
    assert step.cluster == 0
    torch.testing.assert_close(flatten_module(model), _models()[0])  # θ_ĵ loaded by begin
    torch.testing.assert_close(cluster_losses(_models(), MLR(3, 2), [(x, y)]), torch.tensor(on_split), rtol=1e-6, atol=1e-6)

    model = MLR(3, 2)
    _, extras = train_locally(IFCAClient(model, config), model, data, steps=1, lr=lr, batch_size=8,
                              generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(decode_flat(extras[CLUSTER], 2), torch.tensor([1.0, 0.0]))
    load_flat_(probe, _models()[0])  # one SGD step of θ_0 on the first minibatch, by hand
    F.cross_entropy(probe(x[first]), y[first]).backward()
    with torch.no_grad():
        for p in probe.parameters():
            p -= lr * p.grad
    torch.testing.assert_close(flatten_module(model), flatten_module(probe))
    with pytest.raises(ValueError, match="begin"):
        IFCAClient(MLR(3, 2), config).finish(MLR(3, 2))  # no cluster without begin


def test_evaluation_picks_the_cluster_by_the_whole_training_split():
    data, model = _data(), MLR(3, 2)
    config = {MODELS: encode_vector(_models().flip(0).flatten())}
    chosen, extra = IFCAClient.evaluation_model(model, config, None, data, lambda m: None)
    torch.testing.assert_close(flatten_module(chosen), _models()[0])
    assert extra == {}
    with pytest.raises(ValueError, match="k models of 8 float32"):
        IFCAClient.evaluation_model(model, {MODELS: b"\x00" * 12}, None, data, lambda m: None)


def _arrays(value: float) -> dict[str, np.ndarray]:
    return {"fc.weight": np.full((2, 3), value, np.float32), "fc.bias": np.full(2, value, np.float32)}


def _reply(cid, value: float, n: int, cluster: int | None, k: int = 3) -> RawReply:
    extras = {} if cluster is None else {CLUSTER: encode_vector(F.one_hot(torch.tensor(cluster), k).float())}
    return RawReply(cid, list(_arrays(value).values()), None, n, {}, extras)


def test_initial_clusters_are_seeded_shuffles_of_the_initial_model():
    layout = ParamLayout.from_arrays(_arrays(0.0))
    initial = torch.arange(D, dtype=torch.float32)
    models = initial_clusters(initial, layout, 3, seed=5)
    assert torch.equal(models[0], initial) and not torch.equal(models[1], models[2])
    for row in models:  # each tensor's entries, reordered
        assert torch.equal(row[:6].sort().values, initial[:6]) and torch.equal(row[6:].sort().values, initial[6:])
    assert torch.equal(models, initial_clusters(initial, layout, 3, seed=5))


@pytest.mark.parametrize("weighted", [False, True])
def test_server_averages_each_cluster_by_hand(weighted):
    server = MethodServer(IFCA(num_clusters=3, weighted=weighted), clients_per_round=3)
    server.initialize(_arrays(1.0))
    before = server.method.models.clone()
    plan = server.plan_training(1, [1, 2, 3])
    assert all(torch.equal(decode_flat(ins.config[MODELS], 3 * D).view(3, D), before) and ins.config[CLIENT_ALGORITHM] == "ifca"
               for ins in plan)
    replies = [server.check(_reply(1, 2.0, 1, 0)), server.check(_reply(2, 6.0, 3, 0)), server.check(_reply(3, 5.0, 2, 2))]
    assert server.aggregate(1, replies) is None  # no single global model
    mean = 0.25 * 2.0 + 0.75 * 6.0 if weighted else (2.0 + 6.0) / 2  # θ_0 = Σ s_i0 θ̃_i / Σ s_i0 (Algorithm 1)
    torch.testing.assert_close(server.method.models[0], torch.full((D,), mean))
    assert torch.equal(server.method.models[1], before[1])  # nobody chose cluster 1
    torch.testing.assert_close(server.method.models[2], torch.full((D,), 5.0))
    assert server.method.assignment == {1: 0, 2: 0, 3: 2}
    sent = {ins.client_id: ins.model for ins in server.plan_evaluation(1, [1, 2, 3, 4], 1.0)}
    assert torch.equal(sent[3], server.method.models[2]) and torch.equal(sent[4], server.method.models[0])


def test_cluster_identity_is_checked_and_the_update_bound_measures_from_the_chosen_cluster():
    server = MethodServer(IFCA(num_clusters=3), clients_per_round=2)
    server.initialize(_arrays(1.0))
    server.plan_training(1, [1, 2])
    with pytest.raises(AlgorithmOutputMissing, match="lacks 'ifca-cluster'"):
        server.check(_reply(1, 1.0, 1, None))
    for bad, reason in ((encode_vector(torch.tensor([0.5, 0.5, 0.0])), "not a one-hot"),
                        (encode_vector(torch.tensor([1.0, 1.0, 0.0])), "not a one-hot"),
                        (encode_vector(torch.tensor([1.0, 0.0])), "expected 3"),
                        (encode_vector(torch.tensor([float("nan"), 0.0, 1.0])), "NaN")):
        with pytest.raises(UpdateRejected, match=reason):
            server.check(RawReply(1, list(_arrays(1.0).values()), None, 1, {}, {CLUSTER: bad}))
    reply = server.check(_reply(1, 1.0, 1, 2))
    start = server.method.models[2]
    assert server.method.update_norms(reply, torch.zeros(D))["model"] == pytest.approx(
        (float((reply.model - start).norm()), float(start.norm())))


@pytest.mark.parametrize("bad", [{"num_clusters": 0}, {"num_clusters": 1.5}])
def test_bad_hyperparameters_are_refused(bad):
    with pytest.raises(ValueError, match="num_clusters = .* is invalid"):
        IFCA(**bad)


def test_short_run_as_recorded_and_clusters_beat_fedavg(short_runs):
    ifca = short_runs("ifca")
    assert ifca["bmta"] > short_runs("fedavg")["bmta"] + 0.3  # observed 0.712 vs 0.306 (k = 2)
    assert_as_recorded("ifca", ifca)
