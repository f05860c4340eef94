"""pFedHN (its hypernetwork: tests/test_hypernetwork.py): the server's step by hand with
fabricated replies, clipping, exact resume of the hypernetwork, its optimizer and the embeddings,
bad hyperparameters and a whole run."""

import copy
import json

import fabricate as fb
import numpy as np
import pytest
import torch

from flower_pfl.engine.client_algorithm import ClientAlgorithm
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.engine.reply_checks import RawReply
from flower_pfl.methods.pfedhn import PFedHN
from flower_pfl.methods.registry import client_algorithm_for

from .runs import assert_as_recorded

SHAPES = {"fc.weight": (2, 3), "fc.bias": (2,)}


def _server(**kwargs) -> MethodServer:
    server = MethodServer(PFedHN(**{"embed_dim": 3, "hidden": 5, "hidden_layers": 1, **kwargs}), clients_per_round=2, seed=4)
    server.initialize({k: np.zeros(s, np.float32) for k, s in SHAPES.items()})
    return server


def _replies(server, plan, pull: float = 0.5):
    """Each client moves its generated model a fraction ``pull`` of the way to all ones."""
    out = []
    for ins in plan:
        trained = ins.model + pull * (1.0 - ins.model)
        out.append(server.check(RawReply(ins.client_id, [trained[:6].reshape(2, 3).numpy(), trained[6:].numpy()], None, 10, {})))
    return out


def test_server_algorithm_by_hand():
    """``φ ← φ − α Σ_i (∇_φ θ_i)ᵀ (θ_i − θ̃_i)`` and ``v_i ← v_i − α_v (∇_{v_i} θ_i)ᵀ (θ_i − θ̃_i)``
    (plain SGD: no momentum, weight decay or clipping)."""
    server = _server(hn_lr=0.1, embed_lr=0.2, momentum=0.0, weight_decay=0.0, clip=1e9)
    method = server.method
    plan = server.plan_training(1, [7, 8])
    assert all(client_algorithm_for(ins.config) is ClientAlgorithm for ins in plan)  # plain local SGD
    v = torch.stack([method.embeddings[c] for c in (7, 8)])
    with torch.no_grad():
        torch.testing.assert_close(torch.stack([ins.model for ins in plan]), method.hnet(v))  # θ_i = h(v_i; φ)
    before = [p.detach().clone() for p in method.hnet.parameters()]
    replies = _replies(server, plan)
    trained = torch.stack([r.model for r in replies])
    leaf = v.clone().requires_grad_(True)
    grads = torch.autograd.grad(0.5 * (method.hnet(leaf) - trained).pow(2).sum(), [*method.hnet.parameters(), leaf])
    assert server.aggregate(1, replies) is None  # no global model
    for p, b, g in zip(method.hnet.parameters(), before, grads):
        torch.testing.assert_close(p.detach(), b - 0.1 * g)
    torch.testing.assert_close(torch.stack([method.embeddings[c] for c in (7, 8)]), v - 0.2 * grads[-1])
    with torch.no_grad():  # the new models are nearer to what the clients trained
        new = method.hnet(torch.stack([method.embeddings[c] for c in (7, 8)]))
    assert (new - trained).norm() < (torch.stack([ins.model for ins in plan]) - trained).norm()


def test_a_rounds_gradient_is_clipped():
    server = _server(hn_lr=1.0, embed_lr=1.0, momentum=0.0, weight_decay=0.0, clip=0.01)
    before = torch.cat([p.detach().flatten().clone() for p in server.method.hnet.parameters()])
    server.aggregate(1, _replies(server, server.plan_training(1, [1, 2]), pull=1.0))
    after = torch.cat([p.detach().flatten() for p in server.method.hnet.parameters()])
    assert 0 < float((after - before).norm()) <= 0.01 + 1e-6


def test_clients_get_their_own_seeded_models_and_a_resumed_server_algorithms_exactly_alike():
    a, b = _server(), _server()
    for rnd in (1, 2):
        a.aggregate(rnd, _replies(a, a.plan_training(rnd, [1, 2, 3])))
    models = [ins.model for ins in a.plan_evaluation(2, [1, 2, 3], 1.0)]
    assert not torch.equal(models[0], models[1]) and not torch.equal(models[1], models[2])
    b.set_state(copy.deepcopy(a.get_state()))  # as a checkpoint: momentum buffers, φ, embeddings, sampler
    for server in (a, b):
        server.aggregate(3, _replies(server, server.plan_training(3, [1, 2, 3, 4])))
    for x, y in zip(a.plan_evaluation(3, [1, 2, 3, 4], 1.0), b.plan_evaluation(3, [1, 2, 3, 4], 1.0)):
        assert torch.equal(x.model, y.model)
    fresh = _server()
    assert torch.equal(fresh.plan_evaluation(1, [5], 1.0)[0].model, _server().plan_evaluation(1, [5], 1.0)[0].model)


def test_models_with_batch_norm_and_bad_hyperparameters_are_refused():
    assert "without batch normalization" in PFedHN.check_model(fb.facts("dnn-bn")) and PFedHN.check_model(fb.facts("dnn")) is None
    for bad in ({"embed_dim": 0}, {"hn_lr": 0.0}, {"momentum": 1.0}, {"clip": 0.0}, {"embed_lr": -1.0}):
        with pytest.raises(ValueError, match=f"{next(iter(bad))} = .* is invalid"):
            PFedHN(**bad)


def test_short_run_as_recorded_with_a_model_per_client_and_a_falling_loss(short_runs):
    """Six rounds are few for a hypernetwork (observed: 0.096 vs FedAvg's 0.306; over 60 rounds 0.864 vs
    0.860): what is checked is that every client gets its own model and that training makes progress."""
    run, fedavg = short_runs("pfedhn"), short_runs("fedavg")
    last = [json.loads(line) for line in (run["folder"] / "clients.jsonl").read_text().splitlines()]
    assert len({c["model-fingerprint"] for c in last if c["round"] == 6}) == 12
    reference = [json.loads(line) for line in (fedavg["folder"] / "clients.jsonl").read_text().splitlines()]
    assert len({c["model-fingerprint"] for c in reference if c["round"] == 6}) == 1
    assert run["train_loss"][-1] < run["train_loss"][0] - 0.1  # observed 2.23 -> 2.05
    assert_as_recorded("pfedhn", run)
