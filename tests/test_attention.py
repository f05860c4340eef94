import math

import pytest
import torch

from flower_pfl.methods.attention import cosine_similarity_matrix, layerwise_attention, squared_distances


def test_hand_computed_two_clients_one_layer():
    # rows (1, 0) and (1, 1): cos = 1/sqrt(2). With sigma = 1:
    u = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    v, psi = layerwise_attention(u, [slice(0, 2)], sigma=1.0)
    c = 1 / math.sqrt(2)
    self_w = math.e / (math.e + math.exp(c))
    expected_psi = torch.tensor([[self_w, 1 - self_w], [1 - self_w, self_w]])
    assert torch.allclose(psi[0], expected_psi, atol=1e-6)
    assert torch.allclose(v[0], self_w * u[0] + (1 - self_w) * u[1], atol=1e-6)
    assert torch.allclose(v[1], (1 - self_w) * u[0] + self_w * u[1], atol=1e-6)


def test_layers_are_attended_separately():
    # layer A (cols 0-1): clients 0 and 1 agree, client 2 opposite; layer B (col 2): all equal.
    u = torch.tensor([[1.0, 0.0, 3.0], [2.0, 0.0, 3.0], [-1.0, 0.0, 3.0]])
    v, psi = layerwise_attention(u, [slice(0, 2), slice(2, 3)], sigma=2.0)
    e2, em2 = math.exp(2), math.exp(-2)
    w_same, w_opp = e2 / (2 * e2 + em2), em2 / (2 * e2 + em2)
    assert torch.allclose(psi[0, 0], torch.tensor([w_same, w_same, w_opp]), atol=1e-6)
    assert torch.allclose(psi[1], torch.full((3, 3), 1 / 3), atol=1e-6)  # identical layer -> uniform
    assert torch.allclose(v[:, 2], torch.full((3,), 3.0))
    assert torch.allclose(v[0, 0], torch.tensor(w_same * 1 + w_same * 2 - w_opp), atol=1e-5)


def test_rows_sum_to_one_and_sigma_limits():
    torch.manual_seed(0)
    u = torch.randn(7, 12)
    comps = [slice(0, 5), slice(5, 7), slice(7, 12)]  # >1 column each: 1-d components have cos = +-1
    for sigma in (1e-8, 0.5, 50.0, 1e6):
        v, psi = layerwise_attention(u, comps, sigma)
        assert torch.allclose(psi.sum(-1), torch.ones(3, 7), atol=1e-5)
        assert torch.isfinite(v).all() and (psi >= 0).all()
    v_small, _ = layerwise_attention(u, comps, 1e-8)  # sigma -> 0: uniform per-layer mean
    assert torch.allclose(v_small, u.mean(0, keepdim=True).expand_as(u), atol=1e-5)
    v_big, psi_big = layerwise_attention(u, comps, 1e6)  # large sigma: own layer back
    assert torch.allclose(v_big, u, atol=1e-5)
    assert torch.allclose(psi_big, torch.eye(7).expand(3, 7, 7), atol=1e-5)


def test_stable_for_huge_sigma_and_zero_rows():
    u = torch.tensor([[0.0, 0.0], [1.0, 2.0], [1.0, 2.0000001]])
    v, psi = layerwise_attention(u, [slice(0, 2)], sigma=1e30)
    assert torch.isfinite(psi).all() and torch.isfinite(v).all()
    assert torch.allclose(cosine_similarity_matrix(u)[0], torch.zeros(3))


def test_rejects_bad_sigma_and_incomplete_components():
    u = torch.ones(2, 3)
    with pytest.raises(ValueError, match="sigma"):
        layerwise_attention(u, [slice(0, 3)], 0.0)
    with pytest.raises(ValueError, match="cover"):
        layerwise_attention(u, [slice(0, 2)], 1.0)


# -- the products without copies, against the straightforward ones -------------------------------

def _normalized_cosines(x: torch.Tensor) -> torch.Tensor:
    """Cosines from a normalized copy of the rows and one GEMM."""
    xn = x / x.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return (xn @ xn.T).clamp(-1.0, 1.0)


def _models(m: int, d: int, spread: float) -> torch.Tensor:
    """Models sharing a large common part (cosines near 1, the case rounding shows most)."""
    g = torch.Generator().manual_seed(0)
    return 3.0 * torch.randn(1, d, generator=g) + spread * torch.randn(m, d, generator=g)


def test_cosines_from_the_gram_matrix_equal_those_of_normalized_rows():
    x = _models(12, 5000, 0.1)
    x[3] = 0.0
    for part in (x, x[:, 1000:3000]):  # the whole rows, and a column slice (one of FedMCSA's layers)
        torch.testing.assert_close(cosine_similarity_matrix(part), _normalized_cosines(part), rtol=0, atol=2e-6)
    assert (cosine_similarity_matrix(x)[3] == 0).all() and (cosine_similarity_matrix(x)[:, 3] == 0).all()


def test_layerwise_attention_writes_each_layers_product_in_place():
    u = _models(9, 700, 0.5)
    comps = [slice(0, 600), slice(600, 610), slice(610, 690), slice(690, 700)]
    v, psi = layerwise_attention(u, comps, sigma=20.0)
    for l, sl in enumerate(comps):
        w = torch.softmax(20.0 * _normalized_cosines(u[:, sl]), dim=1)
        torch.testing.assert_close(psi[l], w, rtol=0, atol=1e-5)
        torch.testing.assert_close(v[:, sl], w @ u[:, sl], rtol=0, atol=1e-5)


def test_squared_distances_by_column_blocks_match_float64_whatever_the_blocks():
    x = _models(9, 3000, 0.003)  # distances ~1e-4 of the norms: float32 would cancel without centring
    exact = torch.cdist(x.double(), x.double()) ** 2
    c = x - x.mean(0, keepdim=True)  # the centred copy and one float32 GEMM, for comparison
    sq = (c * c).sum(1)
    one_gemm = (sq[:, None] + sq[None, :] - 2.0 * (c @ c.T)).double().clamp_min(0.0).fill_diagonal_(0.0)
    for chunk_bytes in (4 * 9 * 7, 4 * 9 * 1000, 1 << 30):  # blocks of 7 and of 1000 columns, one block
        d2 = squared_distances(x, chunk_bytes)
        assert d2.dtype == torch.float64 and (d2.diagonal() == 0).all()
        assert (d2 - exact).abs().max() <= (one_gemm - exact).abs().max()
        torch.testing.assert_close(d2, exact, rtol=2e-6, atol=0)
