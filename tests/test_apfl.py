"""APFL: one step by hand, α clipped to [0, 1], the mixture kept in client state and evaluated."""

import torch
from flwr.app import Context, RecordDict

from client_apps.app import APFL_STATE, Node
from flower_pfl.config import ExperimentConfig
from flower_pfl.methods.apfl import Mixture, apfl_local_sgd
from flower_pfl.models import MLR
from flower_pfl.solvers import MinibatchStream, evaluate

F = torch.nn.functional


def _setup():
    x = torch.randn(24, 3, generator=torch.Generator().manual_seed(0))
    y = (x[:, 2] > 0).long()
    torch.manual_seed(0)
    w, v = MLR(3, 2), MLR(3, 2)
    return x, y, w, v


def test_one_step_by_hand():
    x, y, w, v = _setup()
    w0, v0 = [p.detach().clone() for p in w.parameters()], [p.detach().clone() for p in v.parameters()]
    _, alpha = apfl_local_sgd(w, v, 0.4, x, y, steps=1, lr=0.1, alpha_lr=0.5, batch_size=8,
                              generator=torch.Generator().manual_seed(1))
    idx = MinibatchStream(24, 8, torch.Generator().manual_seed(1)).next()
    ref_w, ref_v = MLR(3, 2), MLR(3, 2)
    with torch.no_grad():
        for p, t in zip([*ref_w.parameters(), *ref_v.parameters()], [*w0, *v0]):
            p.copy_(t)
    out_w = ref_w(x[idx])
    g_w = torch.autograd.grad(F.cross_entropy(out_w, y[idx]), list(ref_w.parameters()))
    a = torch.tensor(0.4, requires_grad=True)
    mixed = F.cross_entropy(a * ref_v(x[idx]) + (1 - a) * out_w.detach(), y[idx])  # w before its step
    *g_v, g_a = torch.autograd.grad(mixed, [*ref_v.parameters(), a])
    for p, p0, g in zip(w.parameters(), w0, g_w):
        assert torch.allclose(p, p0 - 0.1 * g, atol=1e-6)
    for p, p0, g in zip(v.parameters(), v0, g_v):
        assert torch.allclose(p, p0 - 0.1 * g, atol=1e-6) and g.abs().sum() > 0
    assert abs(alpha - min(1.0, max(0.0, 0.4 - 0.5 * float(g_a)))) < 1e-6


def test_alpha_stays_in_the_unit_interval():
    x, y, w, v = _setup()
    for start in (0.0, 1.0):
        _, alpha = apfl_local_sgd(w, v, start, x, y, steps=5, lr=0.1, alpha_lr=1e4, batch_size=8,
                                  generator=torch.Generator().manual_seed(2))
        assert 0.0 <= alpha <= 1.0


def test_client_keeps_personal_model_and_alpha_and_evaluates_the_mixture():
    state = RecordDict()
    node = Node.from_context(Context(run_id=1, node_id=3, node_config={"partition-id": 0, "num-partitions": 4}, state=state,
                                     run_config=ExperimentConfig().to_run_config()))
    received = [t.clone() for t in node.model.state_dict().values()]
    node.fit({"lr": 0.05, "local-steps": 4, "batch-size": 10, "server-round": 1, "apfl-alpha-lr": 0.1, "apfl-alpha-init": 0.3})
    personal, alpha = node._personal_apfl()
    assert 0.0 <= alpha <= 1.0 and alpha != 0.3 and len(state[APFL_STATE].to_numpy_ndarrays()) == 2
    node.load(received)
    expected = evaluate(Mixture(personal, node.model, alpha), node.data.x_test, node.data.y_test)
    assert abs(node.evaluate({"apfl-mixed": True})["loss"] - expected.loss) < 1e-6
