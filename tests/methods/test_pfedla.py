"""pFedLA (Ma et al. 2022): the layer weights and the layer-wise combination by hand, the server with
fabricated replies (the models sent, the hypernetworks' and embeddings' step against autograd, the
trained models stored), clients that join later, exact resume, a convolutional model, the plain
client in a user's loop, bad hyperparameters and a short run (every layer kept local: Local)."""

import copy

import numpy as np
import pytest
import torch
from floats import same_math

from client_apps.own_loop import algorithm_for
from flower_pfl.engine.client_algorithm import ClientAlgorithm
from flower_pfl.engine.layout import ParamLayout
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.engine.reply_checks import RawReply
from flower_pfl.experiment.models import ConvNet
from flower_pfl.methods.pfedla import PFedLA, combine_layers, layer_weights
from flower_pfl.methods.registry import client_algorithm_for

from .runs import assert_as_recorded, short_run

#: two layers: ``a`` (weight 2x2 and bias 2: columns 0-5) and ``b`` (weight 1x2: columns 6-7)
SHAPES = {"a.weight": (2, 2), "a.bias": (2,), "b.weight": (1, 2)}


def test_layer_weights_by_hand_a_zero_row_and_the_layers_kept_local():
    raw = torch.tensor([[1.0, 3.0, 0.0], [0.0, 0.0, 0.0], [2.0, 1.0, 1.0]])  # 3 layers, 3 clients; client 1's
    assert layer_weights(raw, own=1).tolist() == [[0.25, 0.75, 0.0], [0.0, 1.0, 0.0], [0.5, 0.25, 0.25]]
    # HeurpFedLA, k = 1: the layer with the largest self weight (layer 0: 3.0) is the client's own
    assert layer_weights(raw, own=1, local_layers=1).tolist() == [[0.0, 1.0, 0.0], [0.0, 1.0, 0.0], [0.5, 0.25, 0.25]]
    assert layer_weights(raw, own=2, local_layers=1).tolist() == [[0.25, 0.75, 0.0], [0.0, 0.0, 1.0], [0.0, 0.0, 1.0]]


def test_the_combination_weighs_each_layers_columns_by_that_layers_weights():
    models = torch.tensor([[1.0, 2.0, 3.0], [5.0, 6.0, 7.0]])  # 2 clients; layer 0: columns 0-1, layer 1: column 2
    weights = torch.tensor([[0.25, 0.75], [1.0, 0.0]])
    assert combine_layers(weights, models, [slice(0, 2), slice(2, 3)]).tolist() == [4.0, 5.0, 3.0]


def _server(**kwargs) -> MethodServer:
    server = MethodServer(PFedLA(**{"embed_dim": 3, "hidden": 4, "hn_lr": 0.1, **kwargs}), clients_per_round=2, seed=4)
    server.initialize({k: np.zeros(s, np.float32) for k, s in SHAPES.items()})
    return server


def _replies(server, plan, targets: dict) -> list:
    out = []
    for ins in plan:
        t = torch.as_tensor(targets[ins.client_id], dtype=torch.float32)
        out.append(server.check(RawReply(ins.client_id, [t[:4].reshape(2, 2).numpy(), t[4:6].numpy(), t[6:].reshape(1, 2).numpy()], None, 10, {})))
    return out


def _raw(method, cid) -> torch.Tensor:
    return method.hypernetwork(cid)(method.embeddings[cid][None]).view(2, -1)


def test_server_algorithm_by_hand():
    server = _server(hn_lr=0.001)
    method = server.method
    first = {1: torch.arange(8.0), 2: -torch.arange(8.0)}
    server.aggregate(1, _replies(server, server.plan_training(1, [1, 2]), first))
    torch.testing.assert_close(method.store.get([1, 2]), torch.stack([first[1], first[2]]))  # θ_i ← θ̃_i
    plan = server.plan_training(2, [1, 2])
    assert all(client_algorithm_for(ins.config) is ClientAlgorithm for ins in plan)  # plain local SGD
    models = method.store.get([1, 2])
    for ins in plan:  # θ̂_i^l = Σ_j α_ij^l / Σ_k α_ik^l θ_j^l, layer a = columns 0-5, layer b = 6-7
        with torch.no_grad():
            raw = _raw(method, ins.client_id)
        alpha = raw / raw.sum(1, keepdim=True)
        torch.testing.assert_close(ins.model, torch.cat([alpha[0] @ models[:, :6], alpha[1] @ models[:, 6:]]))
    hnet, v = method.hypernetworks[1], method.embeddings[1].clone()
    before = [p.detach().clone() for p in hnet.parameters()]
    trained = torch.ones(8)
    leaf = v.clone().requires_grad_(True)
    raw = method.hypernetwork(1)(leaf[None]).view(2, -1)
    alpha = raw / raw.sum(1, keepdim=True)
    generated = torch.cat([alpha[0] @ models[:, :6], alpha[1] @ models[:, 6:]])
    grads = torch.autograd.grad(0.5 * (generated - trained).pow(2).sum(), [*hnet.parameters(), leaf])
    other = [p.detach().clone() for p in method.hypernetworks[2].parameters()]
    server.aggregate(2, _replies(server, plan[:1], {1: trained}))  # only client 1 replies
    for p, b, g in zip(hnet.parameters(), before, grads):
        torch.testing.assert_close(p.detach(), b - 0.001 * g)
    torch.testing.assert_close(method.embeddings[1], v - 0.001 * grads[-1])
    assert all(torch.equal(p, o) for p, o in zip(method.hypernetworks[2].parameters(), other))  # its own hypernetwork only
    assert torch.equal(method.store.get([1])[0], trained)
    with torch.no_grad():  # the step moved θ̂_1 toward what client 1 trained
        raw = _raw(method, 1)
    alpha = raw / raw.sum(1, keepdim=True)
    assert (torch.cat([alpha[0] @ models[:, :6], alpha[1] @ models[:, 6:]]) - trained).norm() < (plan[0].model - trained).norm()


def test_a_client_that_joins_later_gets_a_column_in_every_hypernetwork_and_clients_evaluate_their_models():
    server = _server()
    method = server.method
    server.aggregate(1, _replies(server, server.plan_training(1, [1, 2]), {1: torch.arange(8.0), 2: torch.zeros(8)}))
    assert method.clients == [1, 2] and method.hypernetworks[1].heads[0].out_features == 2
    with torch.no_grad():
        old = _raw(method, 1)
    server.aggregate(1, _replies(server, server.plan_training(2, [3, 1]), {1: torch.ones(8), 3: torch.full((8,), 2.0)}))
    assert method.clients == [1, 2, 3]
    with torch.no_grad():
        assert _raw(method, 2).shape == (2, 3)
        head = method.hypernetworks[2].heads[1]  # client 2 has not trained since client 3 joined: its column as it started
        seeded = torch.rand(2, 4, generator=torch.Generator().manual_seed(method.seed * 1_000_003 + 2))
        assert torch.equal(head.weight[2], seeded[1]) and head.bias[2] == 0 and 0 <= seeded.min() and seeded.max() < 1
    assert not torch.equal(_raw(method, 1)[:, :2].detach(), old)  # client 1 learned
    models = [ins.model for ins in server.plan_evaluation(2, [1, 2, 3], 1.0)]
    assert torch.equal(models[0], torch.ones(8)) and torch.equal(models[1], torch.zeros(8)) and torch.equal(models[2], torch.full((8,), 2.0))


def test_a_resumed_server_algorithm_continues_exactly_alike():
    a, b = _server(k=1), _server(k=1)
    targets = {c: torch.full((8,), float(c)) for c in range(1, 6)}
    for rnd, ids in ((1, [1, 2, 3]), (2, [2, 4])):
        a.aggregate(rnd, _replies(a, a.plan_training(rnd, ids), targets))
    b.set_state(copy.deepcopy(a.get_state()))
    for server in (a, b):
        server.aggregate(3, _replies(server, server.plan_training(3, [1, 4, 5]), targets))
    for x, y in zip(a.plan_training(4, [1, 2, 3, 4, 5]), b.plan_training(4, [1, 2, 3, 4, 5])):
        assert torch.equal(x.model, y.model)
    assert a.method.server_state()["layer-weights"][5].shape == (2, 5)


def test_a_convolutional_models_layers_are_its_modules():
    model = ConvNet((1, 16, 16), 3, channels=(2, 3), hidden=(4,))
    layout = ParamLayout.from_module(model)
    server = MethodServer(PFedLA(embed_dim=2, hidden=3), clients_per_round=2, seed=0)
    server.initialize({k: v.numpy() for k, v in model.state_dict().items()})
    plan = server.plan_training(1, [1, 2, 3])
    assert len(server.method.layers) == len(layout.components("module")) == 4
    assert all(ins.model.shape == (layout.dim,) for ins in plan)
    assert len(plan) == 2 and server.method.hypernetwork(1).heads[3].out_features == 3  # every connected client known


def test_the_client_is_plain_sgd_in_a_users_loop_and_bad_hyperparameters_are_refused():
    model = torch.nn.Linear(2, 2)
    assert type(algorithm_for({"lr": 0.1}, model)) is ClientAlgorithm
    for bad in ({"embed_dim": 0}, {"hidden": 0}, {"hn_lr": 0.0}, {"k": -1}):
        with pytest.raises(ValueError, match=f"{next(iter(bad))} = .* is invalid"):
            PFedLA(**bad)
    with pytest.raises(ValueError, match="k = 3 layers kept local, but the model has 2"):
        _server(k=3)


def test_short_run_as_recorded_and_with_every_layer_kept_local_it_is_local_training(short_runs, tmp_path):
    run, local = short_runs("pfedla"), short_runs("local")
    own = short_run("pfedla", tmp_path, **{"pfedla-k": 2})  # the DNN's two layers: θ̂_i = θ_i
    assert own["train_loss"] == same_math(local["train_loss"]) and own["client_loss"] == same_math(local["client_loss"])
    assert run["train_loss"] != pytest.approx(local["train_loss"], rel=1e-3)  # the combination changes training
    assert_as_recorded("pfedla", run)
