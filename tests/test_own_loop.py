"""Client algorithms in a user's own loop (``torch.optim.SGD`` + ``adjust_gradients`` + ``finish``),
handed out by ``client_apps.own_loop.algorithm_for``, give the same models, replies and client state as the
package's loop (``train_locally``) and as each method's update written out here; a second round
starts from the state the first one kept. Ditto, APFL and Per-FedAvg are refused with a pointer;
steps that assume plain SGD check the optimizer."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from floats import assert_same_math
from flwr.app import RecordDict

from client_apps.own_loop import RecordState, algorithm_for
from flower_pfl.engine.client_algorithm import (
    CLIENT_ALGORITHM,
    LEGACY_PROXIMAL_MU,
    PROXIMAL_MU,
    ClientAlgorithm,
    Proximal,
    TrainData,
    train_locally,
)
from flower_pfl.engine.minibatches import MinibatchStream
from flower_pfl.engine.wire import decode_flat, encode_vector
from flower_pfl.experiment.models import build_model
from flower_pfl.methods.all_clients_train import ANCHOR, ANCHOR_KEEP, ANCHOR_SET, ANCHOR_STATE
from flower_pfl.methods.apfl import APFLClient
from flower_pfl.methods.ditto import DittoClient
from flower_pfl.methods.fedattn import BIAS_GRADIENT, BIAS_REG, GLOBAL_BIASES, REPRESENTATION, FedAttnClient
from flower_pfl.methods.igfl import DELTA_STATE, GLOBAL_DELTA, PARTICIPANTS, IGFLCorrection
from flower_pfl.methods.per_fedavg import PerFedAvgClient
from flower_pfl.methods.pfedme import INNER_STEPS, LAMBDA, PERSONAL_LR, THETA_STATE, PFedMeClient
from flower_pfl.methods.registry import client_algorithm_for
from flower_pfl.methods.scaffold import CONTROL, CONTROL_DELTA, CONTROL_STATE, ScaffoldCorrection

STEPS, LR, BATCH, SEED = 4, 0.1, 8, 5
TRAINING = {"lr": LR, "local-steps": STEPS, "batch-size": BATCH}


def _data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(30, 6, generator=g), torch.randint(0, 3, (30,), generator=g)


def _model():
    return build_model("dnn", (6,), 3, hidden_units=5, seed=1)


def _flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().flatten() for t in tensors])


def _batches(y, steps: int = STEPS):
    """The minibatch indices both loops draw (the same seeded stream)."""
    stream = MinibatchStream(len(y), BATCH, torch.Generator().manual_seed(SEED))
    return [stream.next() for _ in range(steps)]


def _user_loop(model, algorithm: ClientAlgorithm, x, y, steps: int = STEPS, loss_fn=F.cross_entropy) -> None:
    """What a user writes: their optimizer and loss, plus the client algorithm's hook."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for idx in _batches(y, steps):
        optimizer.zero_grad()
        loss_fn(model(x[idx]), y[idx]).backward()
        algorithm.adjust_gradients(model, (x[idx], y[idx]))
        optimizer.step()


def _package_loop(model, config, state, x, y) -> dict[str, bytes]:
    """The package's ClientApp loop on the same batches."""
    algorithm = client_algorithm_for(config)(model, config, state)
    _, extras = train_locally(algorithm, model, TrainData(x, y), steps=STEPS, lr=LR, batch_size=BATCH,
                              generator=torch.Generator().manual_seed(SEED))
    return extras


def _written_out(model, x, y, update) -> None:
    """Reference: per batch, the plain data gradient by autograd, then ``update(params, grads)``."""
    params = list(model.parameters())
    for idx in _batches(y):
        grads = torch.autograd.grad(F.cross_entropy(model(x[idx]), y[idx]), params)
        with torch.no_grad():
            update(params, grads, idx)


def _vector(model, shift: float) -> bytes:
    return encode_vector(torch.full((sum(p.numel() for p in model.parameters()),), shift))


def _kept(state: RecordDict, key: str) -> torch.Tensor:
    return _flat(RecordState(state)[key])


def _plain_state(state: RecordDict) -> dict[str, list[torch.Tensor]]:
    """A copy of a node's state as the plain mapping ``train_locally``'s steps also accept."""
    return {k: [t.clone() for t in v] for k, v in RecordState(state).items()}


# ---------------------------------------------------------------- proximal term and its anchor

def _proximal_reference(model, anchor, mu, x, y) -> None:
    def update(params, grads, _):
        for p, g, a in zip(params, grads, anchor):
            p -= LR * (g + mu * (p - a))  # the gradient of f + μ/2 ||w − a||²
    _written_out(model, x, y, update)


def test_proximal_algorithm_matches_the_package_loop_and_remembers_its_anchor():
    x, y = _data()
    reference, mine, package = _model(), _model(), _model()
    received = [p.detach().clone() for p in mine.parameters()]
    _proximal_reference(reference, received, 3.0, x, y)
    state = RecordDict()
    config = {**TRAINING, PROXIMAL_MU: 3.0, ANCHOR: ANCHOR_SET, CLIENT_ALGORITHM: "anchored-proximal"}
    algorithm = algorithm_for(config, mine, state)
    assert isinstance(algorithm, Proximal) and algorithm.mu == 3.0
    assert torch.equal(_kept(state, ANCHOR_STATE), _flat(received))
    _user_loop(mine, algorithm, x, y)
    assert algorithm.finish(mine) == {CLIENT_ALGORITHM: "anchored-proximal"}  # nothing but the receipt
    package_state: dict = {}
    assert _package_loop(package, config, package_state, x, y) == {CLIENT_ALGORITHM: "anchored-proximal"}
    assert torch.allclose(_flat(mine.parameters()), _flat(reference.parameters()), atol=1e-6)
    assert_same_math(_flat(package.parameters()), _flat(mine.parameters()))
    assert torch.equal(_flat(package_state[ANCHOR_STATE]), _flat(received))


def test_proximal_algorithm_keeps_the_remembered_anchor_next_round():
    """FedMCSA's clients that were not sampled: the anchor is the model remembered last, not the received one."""
    x, y = _data()
    state, mine, reference, package = RecordDict(), _model(), _model(), _model()
    algorithm_for({**TRAINING, PROXIMAL_MU: 3.0, ANCHOR: ANCHOR_SET, CLIENT_ALGORITHM: "anchored-proximal"}, mine, state)  # remembers the start model
    anchor = [p.detach().clone() for p in mine.parameters()]
    with torch.no_grad():
        for model in (mine, reference, package):
            for p in model.parameters():
                p.add_(0.5)  # a different received model
    config = {**TRAINING, PROXIMAL_MU: 3.0, ANCHOR: ANCHOR_KEEP, CLIENT_ALGORITHM: "anchored-proximal"}
    package_state = _plain_state(state)
    algorithm = algorithm_for(config, mine, state)
    _user_loop(mine, algorithm, x, y)
    _package_loop(package, config, package_state, x, y)
    _proximal_reference(reference, anchor, 3.0, x, y)
    assert torch.allclose(_flat(mine.parameters()), _flat(reference.parameters()), atol=1e-6)
    assert_same_math(_flat(package.parameters()), _flat(mine.parameters()))
    assert torch.equal(_kept(state, ANCHOR_STATE), _flat(anchor))  # keep: the remembered anchor is unchanged
    # without an anchor mode (Flower's own strategies) the anchor is the received model
    received = [p.detach().clone() for p in mine.parameters()]
    assert all(torch.equal(a, r) for a, r in zip(algorithm_for({**TRAINING, PROXIMAL_MU: 1.0}, mine, state).anchor, received))


def test_proximal_term_pulls_toward_the_anchor():
    x, y = _data()
    plain, pulled = _model(), _model()
    start = _flat(plain.parameters())
    plain_rule = algorithm_for(TRAINING, plain)
    assert type(plain_rule) is ClientAlgorithm
    _user_loop(plain, plain_rule, x, y)
    algorithm = algorithm_for({**TRAINING, LEGACY_PROXIMAL_MU: 5.0}, pulled)  # Flower's legacy FedProx key
    assert isinstance(algorithm, Proximal) and algorithm.mu == 5.0
    _user_loop(pulled, algorithm, x, y)
    assert (_flat(pulled.parameters()) - start).norm() < (_flat(plain.parameters()) - start).norm()


# ---------------------------------------------------------------- refusals and checks

def test_algorithms_that_keep_state_or_assume_plain_sgd_say_so():
    model = _model()
    with pytest.raises(ValueError, match="context.state"):
        algorithm_for({**TRAINING, CLIENT_ALGORITHM: "scaffold", CONTROL: _vector(model, 0.0)}, model)
    with pytest.raises(ValueError, match="context.state"):
        algorithm_for({**TRAINING, PROXIMAL_MU: 1.0, ANCHOR: ANCHOR_KEEP, CLIENT_ALGORITHM: "anchored-proximal"}, model)
    with pytest.raises(ValueError, match="context.state"):
        algorithm_for({**TRAINING, CLIENT_ALGORITHM: "igfl", PARTICIPANTS: 2, GLOBAL_DELTA: _vector(model, 0.0)}, model)
    config = {**TRAINING, CLIENT_ALGORITHM: "scaffold", CONTROL: _vector(model, 0.0)}
    for optimizer, reason in ((torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9), "momentum"),
                              (torch.optim.SGD(model.parameters(), lr=LR, weight_decay=1e-4), "weight decay"),
                              (torch.optim.Adam(model.parameters(), lr=LR), "plain SGD"),
                              (torch.optim.SGD(model.parameters(), lr=LR / 2), "step size")):
        with pytest.raises(ValueError, match=reason):
            algorithm_for(config, model, RecordDict(), optimizer=optimizer)
    algorithm_for(config, model, RecordDict(), optimizer=torch.optim.SGD(model.parameters(), lr=LR))
    algorithm_for({**TRAINING, PROXIMAL_MU: 1.0}, model, optimizer=torch.optim.Adam(model.parameters()))  # any optimizer
    for needs_sgd in (ScaffoldCorrection, IGFLCorrection, FedAttnClient, PFedMeClient):
        assert needs_sgd.needs_plain_sgd and needs_sgd.hookable
    assert not Proximal.needs_plain_sgd


@pytest.mark.parametrize("config,algorithm", [({"ditto-lambda": 1.0}, DittoClient), ({"per-fedavg-alpha": 0.01}, PerFedAvgClient),
                                              ({"apfl-alpha-lr": 0.1, "apfl-alpha-init": 0.5}, APFLClient)])
def test_two_model_methods_are_refused_with_a_pointer(config, algorithm):
    config = {**config, CLIENT_ALGORITHM: algorithm.name}
    assert client_algorithm_for(config) is algorithm and not algorithm.hookable
    with pytest.raises(ValueError, match="client_apps.app"):
        algorithm_for({**TRAINING, **config}, _model(), RecordDict())


def test_missing_or_malformed_settings_are_clear_errors():
    model = _model()
    with pytest.raises(ValueError, match="igfl-global-delta"):
        algorithm_for({**TRAINING, CLIENT_ALGORITHM: "igfl", PARTICIPANTS: 2}, model, RecordDict())
    with pytest.raises(ValueError, match="expected"):  # a control variate of the wrong size
        algorithm_for({**TRAINING, CLIENT_ALGORITHM: "scaffold", CONTROL: _vector(model, 0.0)[:-4]}, model, RecordDict())
    with pytest.raises(ValueError, match="pfedme-personal-lr"):
        algorithm_for({**TRAINING, CLIENT_ALGORITHM: "pfedme", LAMBDA: 15.0, INNER_STEPS: 3}, model)
    with pytest.raises(ValueError, match="'fednext'.*install the flower-pfl release"):
        algorithm_for({**TRAINING, CLIENT_ALGORITHM: "fednext"}, model, RecordDict())
    with pytest.raises(ValueError, match="'lr'"):  # a step that assumes SGD of size lr needs to know it
        algorithm_for({CLIENT_ALGORITHM: "scaffold", CONTROL: _vector(model, 0.0)}, model, RecordDict(),
                               optimizer=torch.optim.SGD(model.parameters(), lr=LR))


# ---------------------------------------------------------------- IGFL-C (Algorithm 2)

def _igfl_reference(model, previous, global_delta, participants, x, y) -> None:
    """Algorithm 2, lines 5-6: ``Δ_I = −η g``, ``Δ_G = (Δ_I − Δw_i^r / T) / |S| + Δw_ps / T``, ``w += Δ_I + Δ_G``."""
    def update(params, grads, _):
        for p, g, dp, dg in zip(params, grads, previous, global_delta):
            delta_i = -LR * g
            p += delta_i + (delta_i - dp / STEPS) / participants + dg / STEPS
    _written_out(model, x, y, update)


def test_igfl_algorithm_matches_algorithm_2_and_keeps_the_delta_for_the_next_round():
    x, y = _data()
    reference, mine, package = _model(), _model(), _model()
    prev = [torch.full_like(p, 0.05) for p in reference.parameters()]
    glob = [torch.full_like(p, -0.02) for p in reference.parameters()]
    _igfl_reference(reference, prev, glob, 3, x, y)
    state = RecordDict()
    RecordState(state)[DELTA_STATE] = prev
    package_state = _plain_state(state)
    start = _flat(mine.parameters())
    config = {**TRAINING, CLIENT_ALGORITHM: "igfl", PARTICIPANTS: 3, GLOBAL_DELTA: encode_vector(_flat(glob))}
    algorithm = algorithm_for(config, mine, state, optimizer=torch.optim.SGD(mine.parameters(), lr=LR))
    assert isinstance(algorithm, IGFLCorrection)
    _user_loop(mine, algorithm, x, y)
    assert algorithm.finish(mine) == {CLIENT_ALGORITHM: "igfl"}
    assert _package_loop(package, config, package_state, x, y) == {CLIENT_ALGORITHM: "igfl"}
    assert torch.allclose(_flat(mine.parameters()), _flat(reference.parameters()), atol=1e-5)
    assert_same_math(_flat(package.parameters()), _flat(mine.parameters()))
    kept = _kept(state, DELTA_STATE)
    assert torch.allclose(kept, _flat(mine.parameters()) - start, atol=1e-6)
    assert_same_math(_flat(package_state[DELTA_STATE]), kept)

    # next round: the delta kept in the state is Δw_i^r
    previous = [t.clone() for t in RecordState(state)[DELTA_STATE]]
    second = _model()
    start = _flat(mine.parameters())
    second.load_state_dict(mine.state_dict())
    reference.load_state_dict(mine.state_dict())
    _igfl_reference(reference, previous, glob, 3, x, y)
    algorithm = algorithm_for(config, mine, state)
    _user_loop(mine, algorithm, x, y)
    algorithm.finish(mine)
    _package_loop(second, config, package_state, x, y)
    assert torch.allclose(_flat(mine.parameters()), _flat(reference.parameters()), atol=1e-5)
    assert_same_math(_flat(second.parameters()), _flat(mine.parameters()))
    assert torch.allclose(_kept(state, DELTA_STATE), _flat(mine.parameters()) - start, atol=1e-6)


def test_igfl_with_one_participant_and_no_deltas_is_sgd_with_twice_the_step():
    x, y = _data()
    mine, reference = _model(), _model()
    zeros = encode_vector(torch.zeros(sum(p.numel() for p in mine.parameters())))
    algorithm = algorithm_for({**TRAINING, CLIENT_ALGORITHM: "igfl", PARTICIPANTS: 1, GLOBAL_DELTA: zeros}, mine, RecordDict())
    _user_loop(mine, algorithm, x, y)

    def update(params, grads, _):
        for p, g in zip(params, grads):
            p -= 2 * LR * g
    _written_out(reference, x, y, update)
    assert torch.allclose(_flat(mine.parameters()), _flat(reference.parameters()), atol=1e-6)


def test_igfl_algorithm_refuses_another_number_of_steps():
    x, y = _data()
    model = _model()
    zeros = encode_vector(torch.zeros(sum(p.numel() for p in model.parameters())))
    algorithm = algorithm_for({**TRAINING, CLIENT_ALGORITHM: "igfl", PARTICIPANTS: 2, GLOBAL_DELTA: zeros}, model, RecordDict())
    _user_loop(model, algorithm, x, y, steps=STEPS - 1)
    with pytest.raises(ValueError, match="local-steps"):
        algorithm.finish(model)


# ---------------------------------------------------------------- SCAFFOLD (option II)

def _scaffold_reference(model, c, ci, x, y) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``K`` steps ``y ← y − η (g + c − c_i)``, then ``c_i⁺ = c_i − c + (x − y) / (K η)``; returns ``(c_i⁺, Δc_i)``."""
    start = [p.detach().clone() for p in model.parameters()]

    def update(params, grads, _):
        for p, g, cg, cl in zip(params, grads, c, ci):
            p -= LR * (g + cg - cl)
    _written_out(model, x, y, update)
    new = [cl - cg + (x0 - p.detach()) / (STEPS * LR) for cl, cg, x0, p in zip(ci, c, start, model.parameters())]
    return new, [n - o for n, o in zip(new, ci)]


def test_scaffold_algorithm_matches_option_ii_and_reports_the_control_delta():
    x, y = _data()
    reference, mine, package = _model(), _model(), _model()
    c = [torch.full_like(p, 0.3) for p in reference.parameters()]
    zeros = [torch.zeros_like(p) for p in reference.parameters()]
    new_ci, delta = _scaffold_reference(reference, c, zeros, x, y)
    state, package_state = RecordDict(), {}
    config = {**TRAINING, CLIENT_ALGORITHM: "scaffold", CONTROL: encode_vector(_flat(c))}
    algorithm = algorithm_for(config, mine, state)
    assert isinstance(algorithm, ScaffoldCorrection)
    _user_loop(mine, algorithm, x, y)
    extras = algorithm.finish(mine)
    package_extras = _package_loop(package, config, package_state, x, y)
    size = len(_flat(c))
    assert torch.allclose(_flat(mine.parameters()), _flat(reference.parameters()), atol=1e-6)
    assert_same_math(_flat(package.parameters()), _flat(mine.parameters()))
    assert torch.allclose(decode_flat(extras[CONTROL_DELTA], size), _flat(delta), atol=1e-4)
    assert torch.allclose(decode_flat(package_extras[CONTROL_DELTA], size), decode_flat(extras[CONTROL_DELTA], size), atol=1e-5)
    assert torch.allclose(_kept(state, CONTROL_STATE), _flat(new_ci), atol=1e-4)
    # next round: the c_i kept in the state is the one option II starts from
    second = copy.deepcopy(mine)
    reference.load_state_dict(mine.state_dict())
    second_ci, second_delta = _scaffold_reference(reference, c, new_ci, x, y)
    algorithm = algorithm_for(config, mine, state)
    _user_loop(mine, algorithm, x, y)
    extras = algorithm.finish(mine)
    package_extras = _package_loop(second, config, package_state, x, y)
    assert torch.allclose(_flat(mine.parameters()), _flat(reference.parameters()), atol=1e-5)
    assert_same_math(_flat(second.parameters()), _flat(mine.parameters()))
    assert torch.allclose(decode_flat(extras[CONTROL_DELTA], size), _flat(second_delta), atol=1e-3)
    assert torch.allclose(decode_flat(package_extras[CONTROL_DELTA], size), decode_flat(extras[CONTROL_DELTA], size), atol=1e-4)
    assert torch.allclose(_kept(state, CONTROL_STATE), _flat(second_ci), atol=1e-3)


# ---------------------------------------------------------------- pFedMe

def _pfedme_reference(model, x, y, lam, personal_lr, inner_steps) -> list[torch.Tensor]:
    """Per step on batch D: ``K`` steps ``θ ← θ − ν (∇f(θ; D) + λ (θ − w))`` from the current θ, then
    ``w ← w − η λ (w − θ)``. Returns θ."""
    theta_model = copy.deepcopy(model)
    params, theta = list(model.parameters()), list(theta_model.parameters())
    for idx in _batches(y):
        for _ in range(inner_steps):
            grads = torch.autograd.grad(F.cross_entropy(theta_model(x[idx]), y[idx]), theta)
            with torch.no_grad():
                for t, g, w in zip(theta, grads, params):
                    t -= personal_lr * (g + lam * (t - w))
        with torch.no_grad():
            for w, t in zip(params, theta):
                w -= LR * lam * (w - t)
    return [t.detach() for t in theta]


def test_pfedme_algorithm_matches_algorithm_1_and_keeps_theta():
    x, y = _data()
    reference, mine, package = _model(), _model(), _model()
    settings = {CLIENT_ALGORITHM: "pfedme", LAMBDA: 15.0, PERSONAL_LR: 0.01, INNER_STEPS: 3}
    theta = _pfedme_reference(reference, x, y, 15.0, 0.01, 3)
    state, package_state = RecordDict(), {}
    config = {**TRAINING, **settings}
    algorithm = algorithm_for(config, mine, state, optimizer=torch.optim.SGD(mine.parameters(), lr=LR))
    assert isinstance(algorithm, PFedMeClient)
    _user_loop(mine, algorithm, x, y)
    assert algorithm.finish(mine) == {CLIENT_ALGORITHM: "pfedme"}
    _package_loop(package, config, package_state, x, y)
    assert torch.allclose(_flat(mine.parameters()), _flat(reference.parameters()), atol=1e-6)
    assert_same_math(_flat(package.parameters()), _flat(mine.parameters()))
    assert torch.allclose(_kept(state, THETA_STATE), _flat(theta), atol=1e-6)  # DNN: parameters only, state_dict order
    assert_same_math(_flat(package_state[THETA_STATE]), _kept(state, THETA_STATE))
    with pytest.raises(ValueError, match="minibatch"):
        algorithm_for(config, mine).adjust_gradients(mine)


def test_pfedme_algorithm_uses_the_users_loss():
    x, y = _data()
    settings = {**TRAINING, CLIENT_ALGORITHM: "pfedme", LAMBDA: 15.0, PERSONAL_LR: 0.1, INNER_STEPS: 3}
    plain, smoothed = _model(), _model()
    _user_loop(plain, algorithm_for(settings, plain), x, y)
    smooth = lambda out, t: F.cross_entropy(out, t, label_smoothing=0.5)
    algorithm = algorithm_for(settings, smoothed, loss_fn=smooth)
    _user_loop(smoothed, algorithm, x, y, loss_fn=smooth)
    assert not torch.allclose(_flat(plain.parameters()), _flat(smoothed.parameters()))


# ---------------------------------------------------------------- FedAttn

def test_fedattn_algorithm_matches_the_package_loop_and_reports_z_and_gradient():
    x, y = _data()
    reference, mine, package = _model(), _model(), _model()
    is_bias = [n.endswith("bias") for n, _ in reference.named_parameters()]
    received_biases = [p.detach().clone() for p, b in zip(reference.parameters(), is_bias) if b]
    anchor = [torch.full_like(b, 0.2) for b in received_biases]

    def update(params, grads, _):  # f + ρ/2 ||b − b_G||² on the biases, ρ = 2
        anchors = iter(anchor)
        for p, g, b in zip(params, grads, is_bias):
            p -= LR * (g + 2.0 * (p - next(anchors)) if b else g)
    _written_out(reference, x, y, update)

    config = {**TRAINING, CLIENT_ALGORITHM: "fedattn", BIAS_REG: 2.0, GLOBAL_BIASES: encode_vector(_flat(anchor))}
    algorithm = algorithm_for(config, mine, optimizer=torch.optim.SGD(mine.parameters(), lr=LR))
    assert isinstance(algorithm, FedAttnClient)
    _user_loop(mine, algorithm, x, y)
    extras = algorithm.finish(mine, [(x[:15], y[:15]), (x[15:], y[15:])])  # a loader's batches work as inputs
    package_extras = _package_loop(package, config, None, x, y)
    assert torch.allclose(_flat(mine.parameters()), _flat(reference.parameters()), atol=1e-6)
    assert_same_math(_flat(package.parameters()), _flat(mine.parameters()))

    with torch.no_grad():  # Z_i: the mean input of the last layer (DNN: the hidden ReLU output), after training
        z = torch.relu(reference.fc1(x)).mean(0)
    gradient = _flat(r - p.detach() for r, p in zip(received_biases, (p for p, b in zip(reference.parameters(), is_bias) if b)))
    gradient = gradient / (LR * STEPS)
    assert torch.allclose(decode_flat(extras[REPRESENTATION], z.numel()), z, atol=1e-5)
    assert torch.allclose(decode_flat(extras[BIAS_GRADIENT], gradient.numel()), gradient, atol=1e-4)
    for key in (REPRESENTATION, BIAS_GRADIENT):
        assert torch.allclose(decode_flat(package_extras[key], len(extras[key]) // 4), decode_flat(extras[key], len(extras[key]) // 4),
                              atol=1e-5)
    with pytest.raises(ValueError, match="representation"):
        algorithm.finish(mine)

