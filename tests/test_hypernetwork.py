"""The server's hypernetwork part (pFedHN, pFedLA): its layers, the update direction against autograd,
through a method's map to the model too, and heads widened for new outputs."""

import torch
from torch import nn

from flower_pfl.engine.hypernetwork import HyperNetwork, hypernetwork_gradients, widen_heads


def test_the_layers_are_an_mlp_and_one_head_per_part_with_the_relus_asked_for():
    plain = HyperNetwork(embed_dim=2, hidden=4, hidden_layers=1, sizes=[3, 5])
    assert [type(m) for m in plain.mlp] == [nn.Linear, nn.ReLU, nn.Linear]
    assert [h.out_features for h in plain.heads] == [3, 5]
    v = torch.randn(6, 2)
    code = plain.mlp(v)
    torch.testing.assert_close(plain(v), torch.cat([plain.heads[0](code), plain.heads[1](code)], 1))
    relu = HyperNetwork(embed_dim=2, hidden=4, hidden_layers=2, sizes=[3], code_relu=True, head_relu=True)
    assert [type(m) for m in relu.mlp] == [nn.Linear, nn.ReLU, nn.Linear, nn.ReLU, nn.Linear, nn.ReLU]
    torch.testing.assert_close(relu(v), torch.relu(relu.heads[0](relu.mlp(v))))
    assert (relu(v) >= 0).all() and (plain(v) < 0).any()


def test_update_direction_is_the_gradient_of_half_the_squared_distance_to_the_trained_models():
    """``(∇_φ θ_i)ᵀ (θ_i − θ̃_i)`` summed over clients is ``∇_φ Σ_i ½ ||h(v_i; φ) − θ̃_i||²``; the same for each ``v_i``."""
    torch.manual_seed(0)
    hnet = HyperNetwork(embed_dim=2, hidden=4, hidden_layers=1, sizes=[6, 2])
    v, trained = torch.randn(3, 2), torch.randn(3, 8)
    v_grad = hypernetwork_gradients(hnet, v, trained)
    ours = [p.grad.clone() for p in hnet.parameters()]
    leaf = v.clone().requires_grad_(True)
    expected = torch.autograd.grad(0.5 * (hnet(leaf) - trained).pow(2).sum(), [*hnet.parameters(), leaf])
    for a, b in zip([*ours, v_grad], expected):
        torch.testing.assert_close(a, b)


def test_through_a_map_to_the_model_it_is_the_chain_rule():
    """``θ = M h(v)`` (a fixed matrix ``M``): the direction is ``(∇_φ h)ᵀ Mᵀ (θ − θ̃)`` by hand."""
    torch.manual_seed(1)
    hnet = HyperNetwork(embed_dim=3, hidden=4, hidden_layers=0, sizes=[2])
    mix, v, trained = torch.randn(5, 2), torch.randn(1, 3), torch.randn(1, 5)
    v_grad = hypernetwork_gradients(hnet, v, trained, to_model=lambda out: out @ mix.T)
    with torch.no_grad():
        code = hnet.mlp(v)
        back = (code @ hnet.heads[0].weight.T + hnet.heads[0].bias) @ mix.T - trained  # θ − θ̃
        upstream = back @ mix  # the gradient at the head's output
    torch.testing.assert_close(hnet.heads[0].weight.grad, upstream.T @ code)
    torch.testing.assert_close(hnet.heads[0].bias.grad, upstream[0])
    torch.testing.assert_close(v_grad, upstream @ hnet.heads[0].weight @ hnet.mlp[0].weight)


def test_widened_heads_keep_their_outputs_and_add_the_given_rows_with_zero_bias():
    torch.manual_seed(2)
    hnet = HyperNetwork(embed_dim=2, hidden=3, hidden_layers=0, sizes=[2, 1])
    v = torch.randn(4, 2)
    before = [p.detach().clone() for p in hnet.parts(v)]
    rows = [torch.ones(1, 3), torch.full((2, 3), 2.0)]
    widen_heads(hnet, rows)
    after = hnet.parts(v)
    assert [h.out_features for h in hnet.heads] == [3, 3] and [tuple(p.shape) for p in after] == [(4, 3), (4, 3)]
    code = hnet.mlp(v)
    for old, new, added in zip(before, after, rows):
        torch.testing.assert_close(new[:, : old.shape[1]], old)
        torch.testing.assert_close(new[:, old.shape[1]:], code @ added.T)
    assert len(list(hnet.parameters())) == 6 and all(p.requires_grad for p in hnet.parameters())
