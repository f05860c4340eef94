"""FedAMP and HeurFedAMP: message-passing weights by hand, and a regularizer that really trains."""

import math

import numpy as np
import pytest
import torch

from flower_pfl.attention import fedamp_weights, heuristic_fedamp_weights
from flower_pfl.layout import ParamLayout
from flower_pfl.methods import FedAMPRule, HeurFedAMPRule
from flower_pfl.methods.base import PROXIMAL_MU
from flower_pfl.models import MLR
from flower_pfl.solvers import local_sgd, proximal_term

W = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0]])


def test_fedamp_weights_by_hand():
    xi = fedamp_weights(W, alpha_k=0.1, sigma=2.0)
    a = lambda d2: 0.1 * math.exp(-d2 / 2.0) / 2.0  # noqa: E731  alpha_k A'(||w_i - w_j||^2)
    off = {(0, 1): a(1.0), (0, 2): a(4.0), (1, 2): a(5.0)}
    for (i, j), v in off.items():
        assert math.isclose(float(xi[i, j]), v, rel_tol=1e-6) and math.isclose(float(xi[j, i]), v, rel_tol=1e-6)
    assert math.isclose(float(xi[0, 0]), 1 - a(1.0) - a(4.0), rel_tol=1e-6)
    assert torch.allclose(xi.sum(1), torch.ones(3))
    u, weights = FedAMPRule(alpha_k=0.1, sigma=2.0).personalize(W, ParamLayout(names=("w",), shapes=((2,),)))
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


def test_the_regularizer_has_a_gradient_toward_the_cloud_model_and_training_follows_it():
    """A common FedAMP implementation builds its regularizer from detached tensors, so it trains
    plain local models. Here the pull toward u_i is real: its gradient is mu (w - u_i), and training
    ends nearer to u_i than plain SGD does."""
    rule = FedAMPRule(alpha_k=0.05, lam=1.0)
    mu = rule.client_config()[PROXIMAL_MU]
    assert mu == 20.0
    torch.manual_seed(0)
    model = MLR(4, 3)
    params = list(model.parameters())
    anchor = [p.detach() + 1.0 for p in params]
    grads = torch.autograd.grad(mu * proximal_term(params, anchor), params)
    for g, p, a in zip(grads, params, anchor):
        assert torch.allclose(g, mu * (p.detach() - a)) and g.abs().min() > 0

    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(1))
    y = (x[:, 0] > 0).long()
    start = {k: v.clone() for k, v in model.state_dict().items()}

    def distance_after(prox_mu: float) -> float:
        model.load_state_dict(start)
        local_sgd(model, x, y, steps=20, lr=0.02, batch_size=16, prox_mu=prox_mu, anchor=anchor,
                  generator=torch.Generator().manual_seed(2))
        return float(sum(((p.detach() - a) ** 2).sum() for p, a in zip(model.parameters(), anchor)))

    assert distance_after(mu) < 0.5 * distance_after(0.0)


def test_rules_validate_their_settings():
    with pytest.raises(ValueError, match="alpha_k"):
        FedAMPRule(alpha_k=0.0)
    with pytest.raises(ValueError, match="self_weight"):
        HeurFedAMPRule(self_weight=1.5)
    assert HeurFedAMPRule().client_config() == {PROXIMAL_MU: 1.0 / 0.05}
    assert np.isclose(HeurFedAMPRule(sigma=5.0).sigma, 5.0)


def test_run_config_refuses_fedamp_weights_that_could_turn_a_self_weight_negative():
    from flower_pfl.config import ConfigError, ExperimentConfig

    with pytest.raises(ConfigError, match="'fedamp-alpha-k'.*at most"):
        ExperimentConfig.from_mapping({"method": "fedamp", "clients-per-round": 21, "fedamp-alpha-k": 0.1, "fedamp-sigma": 1.0})
    assert ExperimentConfig.from_mapping({"method": "fedamp", "clients-per-round": 11, "fedamp-alpha-k": 0.1}).fedamp_alpha_k == 0.1
