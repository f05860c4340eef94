"""IGFL (paper 002): AFL server aggregation and the IGFL-C client step, by hand."""

import math

import pytest
import torch

from flower_pfl.methods.igfl import ATTENTION_MODES, afl_global_delta, igfl_local_sgd
from flower_pfl.models import MLR
from flower_pfl.solvers import MinibatchStream

D = torch.tensor([[2.0, 0.0], [0.0, 1.0]])


def _softmax(*scores):
    e = [math.exp(s) for s in scores]
    return [v / sum(e) for v in e]


def test_self_attention_by_hand():
    update, w = afl_global_delta(D, None, "self")
    a0, b0 = _softmax(4.0, 0.0)  # <d0, d0> = 4, <d0, d1> = 0
    a1, b1 = _softmax(0.0, 1.0)  # <d1, d0> = 0, <d1, d1> = 1
    assert torch.allclose(w, torch.tensor([[a0, b0], [a1, b1]]))
    expected = (torch.tensor([2 * a0, b0]) + torch.tensor([2 * a1, b1])) / 2
    assert torch.allclose(update, expected)


def test_global_attention_by_hand():
    update, w = afl_global_delta(D, None, "global")
    a = _softmax(2.0, 0.5)  # mean delta (1, 0.5): <(2,0), .> = 2, <(0,1), .> = 0.5
    assert torch.allclose(w, torch.tensor(a)) and torch.allclose(update, torch.tensor([2 * a[0], a[1]]))


def test_time_attention_by_hand():
    previous = torch.tensor([[1.0, 0.0], [0.0, 0.0]])  # client 1 takes part for the first time
    update, w = afl_global_delta(D, previous, "time")
    a, b = _softmax(2.0, 0.0)  # q_0 = (1, 0): <q_0, d0> = 2, <q_0, d1> = 0; q_1 = 0 gives a uniform row
    assert torch.allclose(w, torch.tensor([[a, b], [0.5, 0.5]]))
    assert torch.allclose(update, (torch.tensor([2 * a, b]) + torch.tensor([1.0, 0.5])) / 2)
    with pytest.raises(ValueError, match="previous deltas"):
        afl_global_delta(D, None, "time")


@pytest.mark.parametrize("mode", ATTENTION_MODES)
def test_equal_deltas_reduce_to_fedavg(mode):
    deltas = torch.tensor([0.3, -1.2, 5.0]).expand(4, 3).clone()
    previous = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    update, _ = afl_global_delta(deltas, previous, mode)
    assert torch.allclose(update, deltas.mean(0))


@pytest.mark.parametrize("mode", ATTENTION_MODES)
def test_stable_for_huge_dot_products(mode):
    deltas = torch.randn(5, 1000, generator=torch.Generator().manual_seed(1)) * 1e4
    update, w = afl_global_delta(deltas, deltas.flip(0), mode)
    assert torch.isfinite(update).all() and torch.isfinite(w).all()
    assert torch.allclose(w.sum(-1), torch.ones(w.shape[:-1]))


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 4, generator=g)
    return x, (x[:, 0] > 0).long()


def _flat(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_single_client_zero_deltas_is_sgd_with_double_step():
    x, y = _data()
    torch.manual_seed(0)
    model = MLR(4, 2)
    torch.manual_seed(0)
    ref = MLR(4, 2)
    igfl_local_sgd(model, x, y, steps=6, lr=0.1, batch_size=8, previous_delta=None, global_delta=None,
                   num_participants=1, generator=torch.Generator().manual_seed(3))
    stream = MinibatchStream(40, 8, torch.Generator().manual_seed(3))
    for _ in range(6):
        idx = stream.next()
        grads = torch.autograd.grad(torch.nn.functional.cross_entropy(ref(x[idx]), y[idx]), list(ref.parameters()))
        with torch.no_grad():
            for p, g in zip(ref.parameters(), grads):
                p -= 2 * 0.1 * g  # Δ_I + Δ_G = 2 Δ_I when |S| = 1 and the deltas are zero
    assert torch.allclose(_flat(model), _flat(ref), atol=1e-6)


def test_corrections_by_hand_without_gradient_steps():
    """lr = 0: only the corrections act; after T steps w = w_0 - Δw_i^r / |S| + Δw_ps."""
    x, y = _data()
    model = MLR(4, 2)
    start = _flat(model)
    prev = [torch.full_like(p, 0.6) for p in model.parameters()]
    glob = [torch.full_like(p, -0.2) for p in model.parameters()]
    igfl_local_sgd(model, x, y, steps=5, lr=0.0, batch_size=8, previous_delta=prev, global_delta=glob,
                   num_participants=3, generator=torch.Generator())
    assert torch.allclose(_flat(model), start - 0.6 / 3 - 0.2, atol=1e-6)
