"""FedAMP and HeurFedAMP (Huang et al. 2021): message-passing weights by hand, the server algorithm
through both strategies, a proximal client algorithm whose pull toward the cloud model is real, and
short whole runs."""

from __future__ import annotations

import math

import fabricate as fb
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, ConfigRecord
from flwr.common import parameters_to_ndarrays

import strategies
import strategies.message
from client_apps.own_loop import algorithm_for
from flower_pfl.engine.client_algorithm import CLIENT_ALGORITHM, PROXIMAL_MU, ClientAlgorithm, Proximal, TrainData, train_locally
from flower_pfl.engine.layout import ParamLayout
from flower_pfl.engine.minibatches import MinibatchStream
from flower_pfl.experiment.config import ConfigError, ExperimentConfig
from flower_pfl.experiment.models import MLR
from flower_pfl.methods.attention import fedamp_weights, heuristic_fedamp_weights
from flower_pfl.methods.fedamp import FedAMP, HeurFedAMP
from flower_pfl.methods.registry import client_algorithm_for

from .runs import assert_as_recorded

W = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0]])


# ---------------------------------------------------------------- 1. the weights by hand

def test_fedamp_weights_by_hand():
    xi = fedamp_weights(W, alpha_k=0.1, sigma=2.0)
    a = lambda d2: 0.1 * math.exp(-d2 / 2.0) / 2.0  # alpha_k A'(||w_i - w_j||^2)
    off = {(0, 1): a(1.0), (0, 2): a(4.0), (1, 2): a(5.0)}
    for (i, j), v in off.items():
        assert math.isclose(float(xi[i, j]), v, rel_tol=1e-6) and math.isclose(float(xi[j, i]), v, rel_tol=1e-6)
    assert math.isclose(float(xi[0, 0]), 1 - a(1.0) - a(4.0), rel_tol=1e-6)
    assert torch.allclose(xi.sum(1), torch.ones(3))
    u, weights = FedAMP(alpha_k=0.1, sigma=2.0).personalize(W, ParamLayout(names=("w",), shapes=((2,),)))
    assert torch.allclose(u, xi @ W) and torch.equal(weights["model"], xi)


def test_fedamp_refuses_a_negative_self_weight():
    with pytest.raises(ValueError, match="alpha_k = 5.0 is too large"):
        fedamp_weights(torch.zeros(3, 2), alpha_k=5.0, sigma=1.0)  # equal models: xi_ij = alpha_k / sigma each


def test_heuristic_weights_by_hand():
    xi = heuristic_fedamp_weights(W[1:] + torch.tensor([[0.0, 1.0], [1.0, 0.0]]), sigma=3.0, self_weight=0.4)
    assert torch.allclose(xi, torch.tensor([[0.4, 0.6], [0.6, 0.4]]))  # one neighbour takes all of 1 - 0.4
    u = torch.tensor([[1.0, 0.0], [1.0, 0.1], [0.0, 1.0]])
    xi = heuristic_fedamp_weights(u, sigma=3.0, self_weight=0.2)
    cos = torch.nn.functional.cosine_similarity(u[:, None], u[None], dim=2)
    e01, e02 = math.exp(3 * float(cos[0, 1])), math.exp(3 * float(cos[0, 2]))
    assert torch.allclose(xi[0], torch.tensor([0.2, 0.8 * e01 / (e01 + e02), 0.8 * e02 / (e01 + e02)]), atol=1e-6)
    assert torch.allclose(xi.sum(1), torch.ones(3)) and torch.equal(heuristic_fedamp_weights(u[:1], 3.0, 0.2), torch.ones(1, 1))
    out, weights = HeurFedAMP(sigma=3.0, self_weight=0.2).personalize(u, ParamLayout(names=("w",), shapes=((2,),)))
    assert torch.allclose(weights["model"], xi) and torch.allclose(out, xi @ u)


def test_methods_validate_their_settings():
    with pytest.raises(ValueError, match="alpha_k"):
        FedAMP(alpha_k=0.0)
    with pytest.raises(ValueError, match="self_weight"):
        HeurFedAMP(self_weight=1.5)
    assert FedAMP(alpha_k=0.05, lam=1.0).train_config(1) == {PROXIMAL_MU: 20.0}
    assert HeurFedAMP().train_config(1) == {PROXIMAL_MU: 1.0 / 0.05}
    assert np.isclose(HeurFedAMP(sigma=5.0).sigma, 5.0)


def test_run_config_refuses_fedamp_weights_that_could_turn_a_self_weight_negative():
    with pytest.raises(ConfigError, match="'fedamp-alpha-k'.*at most"):
        ExperimentConfig.from_mapping({"method": "fedamp", "clients-per-round": 21, "fedamp-alpha-k": 0.1, "fedamp-sigma": 1.0})
    assert ExperimentConfig.from_mapping({"method": "fedamp", "clients-per-round": 11, "fedamp-alpha-k": 0.1}).option("fedamp-alpha-k") == 0.1
    # HeurFedAMP's self weight is fixed: no such limit
    cfg = ExperimentConfig.from_mapping({"method": "heurfedamp", "clients-per-round": 21, "fedamp-alpha-k": 0.1})
    assert cfg.method_arguments()["alpha_k"] == 0.1


# ---------------------------------------------------------------- 2. the server algorithm

@pytest.fixture(autouse=True)
def _identity():
    fb.set_task_identity()


def _arrays(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"fc.weight": (0.3 * rng.normal(size=(2, 3))).astype(np.float32),
            "fc.bias": (0.3 * rng.normal(size=2)).astype(np.float32)}


def _flat(arrays) -> torch.Tensor:
    return torch.cat([torch.as_tensor(np.asarray(a)).flatten() for a in arrays])


WEIGHTS = {"FedAMP": lambda u: fedamp_weights(u, 0.1, 1.0), "HeurFedAMP": lambda u: heuristic_fedamp_weights(u, 10.0, 0.3)}


@pytest.mark.parametrize("name", sorted(WEIGHTS))
def test_clients_get_their_cloud_model_and_proximal_weight(name):
    grid = fb.FakeGrid(range(5))
    strat = getattr(strategies.message, name)(alpha_k=0.1, clients_per_round=4, min_available_nodes=1, seed=2)
    init = ArrayRecord({k: fb.Array(v) for k, v in _arrays(0).items()})
    for rnd in (1, 2, 3):
        msgs = list(strat.configure_train(rnd, init, ConfigRecord({"lr": 0.01}), grid))
        ids = [m.metadata.dst_node_id for m in msgs]
        stored = strat.method.store.get(ids)
        xi = WEIGHTS[name](stored)
        if rnd > 1:
            assert not torch.allclose(xi, torch.eye(4), atol=1e-3)  # messages really pass: the check below can fail
        for i, m in enumerate(msgs):
            assert torch.allclose(_flat(v.numpy() for v in m.content["arrays"].values()), xi[i] @ stored, atol=1e-6)
            assert m.content["config"]["proximal-mu"] == pytest.approx(1.0 / 0.1)
        strat.aggregate_train(rnd, [fb.train_reply(m, _arrays(10 * rnd + m.metadata.dst_node_id)) for m in msgs])
        for node in ids:
            assert torch.equal(strat.method.store.get([node])[0], _flat(_arrays(10 * rnd + node).values()))


@pytest.mark.parametrize("name", sorted(WEIGHTS))
def test_legacy_sends_the_same_cloud_models(name):
    cm = fb.client_manager([str(i) for i in range(4)])
    legacy = getattr(strategies, name)(alpha_k=0.1, clients_per_round=4, min_available_clients=1, initial_parameters=_arrays(0))
    ins = legacy.configure_fit(1, legacy.initial_parameters, cm)
    legacy.aggregate_fit(1, [(p, fb.fit_res(list(_arrays(int(p.cid) + 1).values()))) for p, _ in ins], [])
    ins = legacy.configure_fit(2, legacy.initial_parameters, cm)
    stored = legacy.method.store.get([int(p.cid) for p, _ in ins])
    xi = WEIGHTS[name](stored)
    for i, (_, fi) in enumerate(ins):
        assert torch.allclose(_flat(parameters_to_ndarrays(fi.parameters)), xi[i] @ stored, atol=1e-6)
        assert fi.config["proximal-mu"] == pytest.approx(10.0)


# ---------------------------------------------------------------- 3. the client: a real pull toward u_i

LR, STEPS, BATCH = 0.02, 20, 16


def _setting():
    torch.manual_seed(0)
    model = MLR(4, 3)
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(1))
    return model, x, (x[:, 0] > 0).long()


def _instruction(method) -> dict:
    """A training instruction's method settings, naming the method's client algorithm as the server does."""
    return {**method.train_config(1), CLIENT_ALGORITHM: method.client_algorithm().name}


def _distance(model, anchor) -> float:
    return float(sum(((p.detach() - a) ** 2).sum() for p, a in zip(model.parameters(), anchor)))


def test_the_regularizer_has_a_gradient_toward_the_cloud_model_and_training_follows_it():
    """A common FedAMP implementation builds its regularizer from detached tensors, so it trains
    plain local models. Here the pull toward u_i is real: its gradient is μ (w − u_i) with
    μ = λ / α_k, and training ends nearer to u_i than plain SGD does."""
    model, _, _ = _setting()
    config = {**_instruction(FedAMP(alpha_k=0.05, lam=1.0)), "lr": LR, "local-steps": STEPS, "batch-size": BATCH}
    mu = config[PROXIMAL_MU]
    assert config[CLIENT_ALGORITHM] == "proximal" and client_algorithm_for(config) is Proximal
    cloud = [p.detach().clone() for p in model.parameters()]  # u_i: the model the client received
    step = client_algorithm_for(config)(model, config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    params = list(model.parameters())
    written_out = torch.autograd.grad(mu / 2 * sum(((p - u) ** 2).sum() for p, u in zip(params, cloud)), params)
    for p in params:
        p.grad = None
    step.adjust_gradients(model, None)
    for p, g, u in zip(params, written_out, cloud):
        assert torch.allclose(p.grad, g) and torch.allclose(p.grad, mu * (p.detach() - u)) and p.grad.abs().min() > 0

    def distance_after(settings) -> float:
        model, x, y = _setting()
        start = [p.detach().clone() for p in model.parameters()]
        step = client_algorithm_for(settings)(model, settings)
        train_locally(step, model, TrainData(x, y), steps=STEPS, lr=LR, batch_size=BATCH, generator=torch.Generator().manual_seed(2))
        return _distance(model, start)

    plain = {**config, CLIENT_ALGORITHM: "sgd", PROXIMAL_MU: 0.0}
    assert client_algorithm_for(plain) is ClientAlgorithm
    assert distance_after(config) < 0.5 * distance_after(plain)


def test_users_loop_equals_the_package_loop_and_the_objective_written_out():
    config = {**_instruction(HeurFedAMP()), "lr": LR, "local-steps": STEPS, "batch-size": BATCH}
    mu = config[PROXIMAL_MU]
    users, x, y = _setting()
    package, reference = _setting()[0], _setting()[0]
    cloud = [p.detach().clone() for p in reference.parameters()]

    step = algorithm_for(config, users, optimizer=torch.optim.SGD(users.parameters(), lr=LR))
    optimizer = torch.optim.SGD(users.parameters(), lr=LR)
    stream = MinibatchStream(len(y), BATCH, torch.Generator().manual_seed(2))
    for _ in range(STEPS):
        idx = stream.next()
        optimizer.zero_grad()
        F.cross_entropy(users(x[idx]), y[idx]).backward()
        step.adjust_gradients(users, (x[idx], y[idx]))
        optimizer.step()
    assert step.finish(users, x) == {CLIENT_ALGORITHM: "proximal"}  # nothing but the receipt

    train_locally(client_algorithm_for(config)(package, config), package, TrainData(x, y), steps=STEPS, lr=LR, batch_size=BATCH,
                  generator=torch.Generator().manual_seed(2))

    stream = MinibatchStream(len(y), BATCH, torch.Generator().manual_seed(2))
    params = list(reference.parameters())
    for _ in range(STEPS):  # f_i(w) + λ/(2 α_k) ||w − u_i||², by autograd
        idx = stream.next()
        loss = F.cross_entropy(reference(x[idx]), y[idx]) + mu / 2 * sum(((p - u) ** 2).sum() for p, u in zip(params, cloud))
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads):
                p -= LR * g
    flat = [torch.cat([p.detach().flatten() for p in m.parameters()]) for m in (users, package, reference)]
    assert torch.allclose(flat[0], flat[1], atol=1e-6) and torch.allclose(flat[1], flat[2], atol=1e-5)


# ---------------------------------------------------------------- 4. whole runs

@pytest.mark.parametrize("label", ["fedamp", "heurfedamp"])
def test_short_run_as_recorded_and_better_than_fedavg(label, short_runs):
    summary = short_runs(label)
    assert_as_recorded(label, summary)
    assert summary["bmta"] > short_runs("fedavg")["bmta"] + 0.05


def test_float32_distances_match_float64_on_large_models_sharing_a_big_common_part():
    """FedAMP's weights from float32 models (one GEMM on centred rows) against float64 ``cdist``: models
    that share a large common component and differ by a little, the case where ``||a||² + ||b||² − 2a·b``
    in float32 would cancel catastrophically without the centring."""
    from flower_pfl.methods.attention import squared_distances

    g = torch.Generator().manual_seed(0)
    common = 3.0 * torch.randn(1, 100_000, generator=g)
    u = common + 0.003 * torch.randn(20, 100_000, generator=g)
    exact = torch.cdist(u.double(), u.double()) ** 2
    assert torch.allclose(squared_distances(u).double(), exact, rtol=1e-4, atol=1e-6)
    sigma = float(exact.mean())  # distances of order sigma: weights far from 0 and from alpha_k / sigma
    ours = fedamp_weights(u, alpha_k=sigma / 40, sigma=sigma)
    ref_xi = sigma / 40 * torch.exp(-exact / sigma) / sigma
    ref_xi.fill_diagonal_(0.0)
    ref = ref_xi + torch.diag(1.0 - ref_xi.sum(1))
    assert ours.dtype == torch.float32 and float((ours.double() - ref).abs().max()) < 1e-6
