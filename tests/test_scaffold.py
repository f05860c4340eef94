"""SCAFFOLD option II, exactly."""

import torch

from flower_pfl.methods.scaffold import scaffold_local_sgd, scaffold_server_update
from flower_pfl.models import MLR
from flower_pfl.solvers import MinibatchStream


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 3, generator=g)
    return x, (x[:, 1] > 0).long()


def test_steps_use_corrected_gradient_and_option_ii_update():
    x, y = _data()
    torch.manual_seed(0)
    model = MLR(3, 2)
    torch.manual_seed(0)
    ref = MLR(3, 2)
    start = [p.detach().clone() for p in model.parameters()]
    c = [torch.full_like(p, 0.05) for p in model.parameters()]
    ci = [torch.full_like(p, -0.02) for p in model.parameters()]
    _, new_ci, delta_c = scaffold_local_sgd(model, x, y, steps=4, lr=0.1, batch_size=8, c_global=c, c_local=ci,
                                            generator=torch.Generator().manual_seed(5))
    stream = MinibatchStream(32, 8, torch.Generator().manual_seed(5))
    for _ in range(4):  # y <- y - lr (g + c - c_i), by hand
        idx = stream.next()
        grads = torch.autograd.grad(torch.nn.functional.cross_entropy(ref(x[idx]), y[idx]), list(ref.parameters()))
        with torch.no_grad():
            for p, g, cg, cl in zip(ref.parameters(), grads, c, ci):
                p -= 0.1 * (g + cg - cl)
    for p, r in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(p, r, atol=1e-6)
    for n, cl, cg, x0, p, d in zip(new_ci, ci, c, start, model.parameters(), delta_c):
        assert torch.allclose(n, cl - cg + (x0 - p.detach()) / (4 * 0.1), atol=1e-5)  # option II
        assert torch.allclose(d, n - cl)


def test_without_data_gradient_the_local_variate_resets():
    """Zero gradient: y = x - K η (c - c_i), so c_i^+ = c_i - c + (c - c_i) = 0."""
    model = torch.nn.Linear(3, 2, bias=False)
    x, y = torch.zeros(8, 3), torch.zeros(8, dtype=torch.long)
    c, ci = [torch.full((2, 3), 0.3)], [torch.full((2, 3), -0.1)]
    _, new_ci, _ = scaffold_local_sgd(model, x, y, steps=3, lr=0.5, batch_size=4, c_global=c, c_local=ci,
                                      generator=torch.Generator())
    assert torch.allclose(new_ci[0], torch.zeros(2, 3), atol=1e-6)


def test_server_update_by_hand():
    x, c = torch.tensor([1.0, 1.0]), torch.tensor([0.0, 0.5])
    dy = torch.tensor([[0.2, 0.0], [0.4, -0.2]])
    dc = torch.tensor([[1.0, 1.0], [3.0, -1.0]])
    new_x, new_c = scaffold_server_update(x, c, dy, dc, num_clients=10, lr_global=0.5)
    assert torch.allclose(new_x, torch.tensor([1.0 + 0.5 * 0.3, 1.0 - 0.5 * 0.1]))
    assert torch.allclose(new_c, torch.tensor([0.0 + 0.2 * 2.0, 0.5 + 0.2 * 0.0]))
