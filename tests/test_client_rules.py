"""Client-side rules in a user's own loop (torch.optim.SGD) give the same models and replies as
this package's solvers, and keep the same client state."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, RecordDict

from client_apps.rules import (
    ANCHOR_STATE, IGFL_STATE, PFEDME_STATE, SCAFFOLD_STATE, ClientRule, FedAttnRule, IGFLCorrection, PFedMeRule, Proximal,
    ScaffoldCorrection, client_method,
)
from flower_pfl.methods.base import ANCHOR, ANCHOR_KEEP, ANCHOR_SET, PROXIMAL_MU
from flower_pfl.methods.fedattn import BIAS_GRADIENT, BIAS_REG, FEDATTN, GLOBAL_BIASES, REPRESENTATION, fedattn_local_sgd
from flower_pfl.methods.igfl import CORRECTION, GLOBAL_DELTA, PARTICIPANTS, igfl_local_sgd
from flower_pfl.methods.pfedme import INNER_STEPS, LAMBDA, PERSONAL_LR, pfedme_local_sgd
from flower_pfl.methods.scaffold import CONTROL, CONTROL_DELTA, scaffold_local_sgd
from flower_pfl.models import build_model
from flower_pfl.solvers import MinibatchStream, local_sgd
from flower_pfl.wire import decode_flat, encode_vector

STEPS, LR, BATCH = 4, 0.1, 8
SOLVER = {"lr": LR, "local-steps": STEPS, "batch-size": BATCH}

def _data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(30, 6, generator=g), torch.randint(0, 3, (30,), generator=g)

def _model():
    return build_model("dnn", (6,), 3, hidden=5, seed=1)

def _flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().flatten() for t in tensors])

def _user_loop(model, rule: ClientRule, x, y, steps: int = STEPS) -> None:
    """What a user writes: their optimizer and loss, plus the rule's hook."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    stream = MinibatchStream(len(y), BATCH, torch.Generator().manual_seed(5))
    for _ in range(steps):
        idx = stream.next()
        optimizer.zero_grad()
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        rule.adjust_gradients(model, (x[idx], y[idx]))
        optimizer.step()

def _vector(model, shift: float) -> bytes:
    return encode_vector(torch.full((sum(p.numel() for p in model.parameters()),), shift))

def test_proximal_rule_matches_the_proximal_solver_and_remembers_its_anchor():
    x, y = _data()
    reference, mine = _model(), _model()
    local_sgd(reference, x, y, steps=STEPS, lr=LR, batch_size=BATCH, prox_mu=3.0, generator=torch.Generator().manual_seed(5))
    state = RecordDict()
    rule = ClientRule.from_config({**SOLVER, PROXIMAL_MU: 3.0, ANCHOR: ANCHOR_SET}, mine, state)
    assert isinstance(rule, Proximal) and ANCHOR_STATE in state
    _user_loop(mine, rule, x, y)
    assert torch.allclose(_flat(mine.parameters()), _flat(reference.parameters()), atol=1e-6)
    assert rule.finish(mine) == {}

def test_proximal_rule_keeps_the_remembered_anchor_next_round():
    """FedMCSA's clients that were not sampled: the anchor is the model remembered last, not the received one."""
    x, y = _data()
    state, mine, reference = RecordDict(), _model(), _model()
    ClientRule.from_config({**SOLVER, PROXIMAL_MU: 3.0, ANCHOR: ANCHOR_SET}, mine, state)  # remembers the start model
    anchor = [p.detach().clone() for p in mine.parameters()]
    with torch.no_grad():
        for m, r in zip(mine.parameters(), reference.parameters()):
            m.add_(0.5), r.add_(0.5)  # a different received model
    rule = ClientRule.from_config({**SOLVER, PROXIMAL_MU: 3.0, ANCHOR: ANCHOR_KEEP}, mine, state)
    _user_loop(mine, rule, x, y)
    local_sgd(reference, x, y, steps=STEPS, lr=LR, batch_size=BATCH, prox_mu=3.0, anchor=anchor,
              generator=torch.Generator().manual_seed(5))
    assert torch.allclose(_flat(mine.parameters()), _flat(reference.parameters()), atol=1e-6)


def test_rules_that_keep_state_or_assume_plain_sgd_say_so():
    model = _model()
    with pytest.raises(ValueError, match="context.state"):
        ClientRule.from_config({**SOLVER, CONTROL: _vector(model, 0.0)}, model)
    with pytest.raises(ValueError, match="context.state"):
        ClientRule.from_config({**SOLVER, PROXIMAL_MU: 1.0, ANCHOR: ANCHOR_KEEP}, model)
    config = {**SOLVER, CONTROL: _vector(model, 0.0)}
    for optimizer, reason in ((torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9), "momentum"),
                              (torch.optim.Adam(model.parameters(), lr=LR), "plain SGD"),
                              (torch.optim.SGD(model.parameters(), lr=LR / 2), "step size")):
        with pytest.raises(ValueError, match=reason):
            ClientRule.from_config(config, model, RecordDict(), optimizer=optimizer)
    ClientRule.from_config(config, model, RecordDict(), optimizer=torch.optim.SGD(model.parameters(), lr=LR))
    ClientRule.from_config({**SOLVER, PROXIMAL_MU: 1.0}, model, optimizer=torch.optim.Adam(model.parameters()))  # any optimizer


def test_pfedme_rule_uses_the_users_loss():
    x, y = _data()
    settings = {**SOLVER, LAMBDA: 15.0, PERSONAL_LR: 0.1, INNER_STEPS: 3}
    plain, smoothed = _model(), _model()
    _user_loop(plain, ClientRule.from_config(settings, plain), x, y)
    rule = ClientRule.from_config(settings, smoothed, loss_fn=lambda out, t: F.cross_entropy(out, t, label_smoothing=0.5))
    _user_loop(smoothed, rule, x, y)
    assert not torch.allclose(_flat(plain.parameters()), _flat(smoothed.parameters()))


def test_proximal_term_pulls_toward_the_anchor():
    x, y = _data()
    plain, pulled = _model(), _model()
    start = _flat(plain.parameters())
    _user_loop(plain, ClientRule.from_config(SOLVER, plain), x, y)
    _user_loop(pulled, ClientRule.from_config({**SOLVER, "proximal_mu": 5.0}, pulled), x, y)  # Flower's legacy FedProx key
    assert (_flat(pulled.parameters()) - start).norm() < (_flat(plain.parameters()) - start).norm()

def test_igfl_rule_matches_igfl_local_sgd_and_keeps_the_delta():
    x, y = _data()
    reference, mine = _model(), _model()
    prev = [torch.full_like(p, 0.05) for p in reference.parameters()]
    glob = [torch.full_like(p, -0.02) for p in reference.parameters()]
    igfl_local_sgd(reference, x, y, steps=STEPS, lr=LR, batch_size=BATCH, previous_delta=prev, global_delta=glob,
                   num_participants=3, generator=torch.Generator().manual_seed(5))
    state = RecordDict()
    state[IGFL_STATE] = ArrayRecord([p.numpy() for p in prev])
    start = _flat(mine.parameters())
    config = {**SOLVER, CORRECTION: True, PARTICIPANTS: 3, GLOBAL_DELTA: encode_vector(_flat(glob))}
    rule = ClientRule.from_config(config, mine, state)
    assert isinstance(rule, IGFLCorrection)
    _user_loop(mine, rule, x, y)
    rule.finish(mine)
    assert torch.allclose(_flat(mine.parameters()), _flat(reference.parameters()), atol=1e-5)
    kept = _flat(torch.as_tensor(a) for a in state[IGFL_STATE].to_numpy_ndarrays())
    assert torch.allclose(kept, _flat(mine.parameters()) - start, atol=1e-6)

def test_igfl_rule_refuses_another_number_of_steps():
    x, y = _data()
    model = _model()
    zeros = encode_vector(torch.zeros(sum(p.numel() for p in model.parameters())))
    rule = ClientRule.from_config({**SOLVER, CORRECTION: True, PARTICIPANTS: 2, GLOBAL_DELTA: zeros}, model, RecordDict())
    _user_loop(model, rule, x, y, steps=STEPS - 1)
    with pytest.raises(ValueError, match="local-steps"):
        rule.finish(model)

def test_scaffold_rule_matches_scaffold_local_sgd_and_reports_the_control_delta():
    x, y = _data()
    reference, mine = _model(), _model()
    c = [torch.full_like(p, 0.3) for p in reference.parameters()]
    zeros = [torch.zeros_like(p) for p in reference.parameters()]
    _, new_ci, delta = scaffold_local_sgd(reference, x, y, steps=STEPS, lr=LR, batch_size=BATCH, c_global=c, c_local=zeros,
                                          generator=torch.Generator().manual_seed(5))
    state = RecordDict()
    rule = ClientRule.from_config({**SOLVER, CONTROL: encode_vector(_flat(c))}, mine, state)
    assert isinstance(rule, ScaffoldCorrection)
    _user_loop(mine, rule, x, y)
    extras = rule.finish(mine)
    assert torch.allclose(_flat(mine.parameters()), _flat(reference.parameters()), atol=1e-6)
    assert torch.allclose(decode_flat(extras[CONTROL_DELTA], len(_flat(c))), _flat(delta), atol=1e-4)
    assert torch.allclose(_flat(torch.as_tensor(a) for a in state[SCAFFOLD_STATE].to_numpy_ndarrays()), _flat(new_ci), atol=1e-4)
    # next round: the c_i kept in the state is the one the solver would start from
    _, second_ci, second_delta = scaffold_local_sgd(reference, x, y, steps=STEPS, lr=LR, batch_size=BATCH, c_global=c,
                                                    c_local=new_ci, generator=torch.Generator().manual_seed(5))
    rule = ClientRule.from_config({**SOLVER, CONTROL: encode_vector(_flat(c))}, mine, state)
    _user_loop(mine, rule, x, y)
    extras = rule.finish(mine)
    assert torch.allclose(_flat(mine.parameters()), _flat(reference.parameters()), atol=1e-5)
    assert torch.allclose(decode_flat(extras[CONTROL_DELTA], len(_flat(c))), _flat(second_delta), atol=1e-3)

def test_pfedme_rule_matches_pfedme_local_sgd_and_keeps_theta():
    x, y = _data()
    reference, mine = _model(), _model()
    settings = {LAMBDA: 15.0, PERSONAL_LR: 0.01, INNER_STEPS: 3}
    _, theta = pfedme_local_sgd(reference, x, y, steps=STEPS, lr=LR, batch_size=BATCH, generator=torch.Generator().manual_seed(5),
                                lam=15.0, personal_lr=0.01, inner_steps=3)
    state = RecordDict()
    rule = ClientRule.from_config({**SOLVER, **settings}, mine, state)
    assert isinstance(rule, PFedMeRule)
    _user_loop(mine, rule, x, y)
    rule.finish(mine)
    assert torch.allclose(_flat(mine.parameters()), _flat(reference.parameters()), atol=1e-6)
    assert torch.allclose(torch.as_tensor(state[PFEDME_STATE].to_numpy_ndarrays()[0]), _flat(theta), atol=1e-6)
    with pytest.raises(ValueError, match="minibatch"):
        ClientRule.from_config({**SOLVER, **settings}, mine).adjust_gradients(mine)

def test_fedattn_rule_matches_fedattn_local_sgd_and_reports_z_and_gradient():
    x, y = _data()
    reference, mine = _model(), _model()
    biases = [p for n, p in reference.named_parameters() if n.endswith("bias")]
    anchor = [torch.full_like(b, 0.2) for b in biases]
    _, z, gradient = fedattn_local_sgd(reference, x, y, steps=STEPS, lr=LR, batch_size=BATCH, bias_reg=2.0, global_biases=anchor,
                                       generator=torch.Generator().manual_seed(5))
    rule = ClientRule.from_config({**SOLVER, FEDATTN: True, BIAS_REG: 2.0, GLOBAL_BIASES: encode_vector(_flat(anchor))}, mine)
    assert isinstance(rule, FedAttnRule)
    _user_loop(mine, rule, x, y)
    extras = rule.finish(mine, [(x[:15], y[:15]), (x[15:], y[15:])])  # a loader's batches work as inputs
    assert torch.allclose(_flat(mine.parameters()), _flat(reference.parameters()), atol=1e-6)
    assert torch.allclose(decode_flat(extras[REPRESENTATION], z.numel()), z, atol=1e-5)
    assert torch.allclose(decode_flat(extras[BIAS_GRADIENT], gradient.numel()), gradient, atol=1e-4)
    with pytest.raises(ValueError, match="representation"):
        rule.finish(mine)

@pytest.mark.parametrize("config,method", [({"ditto-lambda": 1.0}, "ditto"), ({"per-fedavg-alpha": 0.01}, "per-fedavg"),
                                           ({"apfl-alpha-lr": 0.1, "apfl-alpha-init": 0.5}, "apfl")])
def test_two_model_methods_are_refused_with_a_pointer(config, method):
    assert client_method(config) == method
    with pytest.raises(ValueError, match="client_apps.app"):
        ClientRule.from_config({**SOLVER, **config}, _model())

def test_missing_setting_is_a_clear_error():
    model = _model()
    with pytest.raises(ValueError, match="igfl-global-delta"):
        ClientRule.from_config({**SOLVER, CORRECTION: True, PARTICIPANTS: 2}, model, RecordDict())
    with pytest.raises(ValueError, match="expected"):  # a control variate of the wrong size
        ClientRule.from_config({**SOLVER, CONTROL: _vector(model, 0.0)[:-4]}, model, RecordDict())
