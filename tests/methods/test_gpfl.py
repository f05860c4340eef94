"""GPFL (Zhang et al. 2023): the conditional inputs, the guidance losses and the valve by hand, one
client's steps against the paper's loss (class shares from the whole split), the server (shared
extractor, personal heads, averaged GCE and CoV) with fabricated replies, what it refuses, and a short
run (the valve and guidance change it)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from batching import assert_together_is_one_by_one, same_vector_extras

from client_apps.own_loop import algorithm_for
from flower_pfl.engine.batched import unbatched
from flower_pfl.engine.client_algorithm import CLIENT_ALGORITHM, LR, TrainData, train_locally
from flower_pfl.engine.layout import ParamLayout, flatten_module
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.engine.minibatches import MinibatchStream
from flower_pfl.engine.model_split import body_slice, head_slice
from flower_pfl.engine.reply_checks import AlgorithmOutputMissing, RawReply
from flower_pfl.engine.side_modules import built
from flower_pfl.engine.wire import decode_flat, encode_vector
from flower_pfl.experiment.models import DNN, build_model
from flower_pfl.methods.gpfl import (
    GPFL,
    LAMBDA,
    LOCAL_MODULES,
    MODULES,
    MU,
    ConditionalValve,
    GPFLClient,
    Valved,
    angle_loss,
    class_shares,
    conditional_inputs,
    gpfl_modules,
    magnitude_loss,
)

from .runs import assert_as_recorded, short_run


def test_the_conditional_inputs_and_guidance_losses_by_hand():
    embeddings = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    g, p = conditional_inputs(embeddings, torch.tensor([0.25, 0.75]))
    assert g.tolist() == [0.5, 1.0] and p.tolist() == [0.25, 1.5]
    # cosines of (1, 0) with the two classes: 1 and 0
    assert float(angle_loss(torch.tensor([[3.0, 0.0]]), embeddings, torch.tensor([0]))) == pytest.approx(-math.log(math.e / (math.e + 1)))
    assert float(magnitude_loss(torch.tensor([[3.0, 4.0], [1.0, 0.0]]), torch.tensor([[0.0, 0.0], [1.0, 2.0]]))) == pytest.approx(math.sqrt(25 + 4))
    assert class_shares(torch.tensor([0, 0, 2, 0]), 3).tolist() == [0.75, 0.0, 0.25]


def test_the_valve_scales_and_shifts_the_feature_by_hand():
    cov = ConditionalValve(2).requires_grad_(False)
    for branch, bias in ((cov.gamma, 1.0), (cov.beta, -2.0)):
        branch[0].weight.zero_()
        branch[0].bias.zero_()
        branch[2].bias.fill_(bias)  # LayerNorm of a constant row: its bias
    out = cov(torch.tensor([[1.0, 3.0]]), torch.tensor([5.0, 5.0]))
    assert out.tolist() == [[max(1.0 * 2 - 2, 0.0), 3.0 * 2 - 2]]  # ReLU(h ⊙ (γ + 1) + β)


def _model(seed: int = 0) -> DNN:
    torch.manual_seed(seed)
    return DNN(6, 3, hidden=4)


def _config(lam: float = 0.5, mu: float = 0.1) -> dict:
    return {CLIENT_ALGORITHM: "gpfl", LAMBDA: lam, MU: mu, MODULES: encode_vector(flatten_module(built(gpfl_modules, 4, 3, seed=3))),
            LR: 0.1, "local-steps": 3, "batch-size": 8}


def _data() -> TrainData:
    torch.manual_seed(3)
    return TrainData(torch.randn(24, 6), torch.tensor([0] * 18 + [1] * 6))  # class 2 absent


def test_the_clients_steps_follow_the_papers_loss_with_the_whole_splits_class_shares():
    data, config, model, ref = _data(), _config(), _model(), _model()
    _, extras = train_locally(GPFLClient(model, config), model, data, steps=3, lr=0.1, batch_size=8,
                              generator=torch.Generator().manual_seed(5))
    modules = built(gpfl_modules, 4, 3, seed=3)
    e = modules["gce"].weight.detach().clone()
    g, p = e.mean(0), 0.75 * e[0] + 0.25 * e[1]
    stream = MinibatchStream(24, 8, torch.Generator().manual_seed(5))
    side = list(modules.parameters())
    params = list(ref.parameters()) + side
    for _ in range(3):
        idx = stream.next()
        x, y = data.x[idx], data.y[idx]
        h = torch.relu(ref.fc1(x))
        f_p, f_g = modules["cov"](h, p), modules["cov"](h, g)
        cosines = F.normalize(f_g) @ F.normalize(modules["gce"].weight).T
        loss = (F.cross_entropy(ref.fc2(f_p), y) + F.cross_entropy(cosines, y) + 0.5 * (f_g - e[y]).norm()
                + 0.1 / 2 * sum((q * q).sum() for q in side))
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for q, grad in zip(params, grads):
                q.sub_(0.1 * grad)
    assert torch.allclose(flatten_module(model), flatten_module(ref), atol=1e-6)
    assert torch.allclose(decode_flat(extras[LOCAL_MODULES], len(flatten_module(modules))), flatten_module(modules), atol=1e-6)
    assert extras[CLIENT_ALGORITHM] == "gpfl"


def test_the_regularization_matters_and_the_client_evaluates_its_valved_head():
    data = _data()
    outs = {}
    for mu in (0.1, 0.0):
        model = _model()
        _, extras = train_locally(GPFLClient(model, _config(mu=mu)), model, data, steps=3, lr=0.1, batch_size=8,
                                  generator=torch.Generator().manual_seed(5))
        outs[mu] = extras[LOCAL_MODULES]
    assert outs[0.1] != outs[0.0]
    model = _model()
    evaluated, metrics = GPFLClient.evaluation_model(model, _config(), None, data, lambda m: None)
    modules = built(gpfl_modules, 4, 3, seed=3)
    p = 0.75 * modules["gce"].weight[0] + 0.25 * modules["gce"].weight[1]
    assert isinstance(evaluated, Valved) and metrics == {}
    assert torch.allclose(evaluated(data.x), model.fc2(modules["cov"](torch.relu(model.fc1(data.x)), p)))


def test_a_users_loop_and_bad_values_are_refused():
    with pytest.raises(ValueError, match="client_apps.app"):
        algorithm_for(_config(), _model())
    with pytest.raises(ValueError, match="gpfl-lambda"):
        GPFLClient(_model(), _config(lam=-1.0))
    with pytest.raises(ValueError, match="gpfl-mu"):
        GPFLClient(_model(), _config(mu=float("nan")))
    with pytest.raises(ValueError, match="'gpfl-modules'"):
        GPFLClient(_model(), {k: v for k, v in _config().items() if k != MODULES})
    with pytest.raises(ValueError, match="mu"):
        GPFL(mu=-0.5)


def _arrays(body: float, head: float) -> dict:
    layout = ParamLayout.from_module(_model())
    flat = torch.empty(layout.dim)
    flat[body_slice(layout)], flat[head_slice(layout)] = body, head
    return {k: v.numpy() for k, v in layout.unflatten(flat).items()}


def test_the_server_shares_the_extractor_gce_and_cov_and_keeps_each_head():
    model = _model()
    layout = ParamLayout.from_module(model)
    server = MethodServer(GPFL(lam=0.5, mu=0.2), clients_per_round=2)
    server.initialize({k: v.numpy() for k, v in model.state_dict().items()})
    plan = server.plan_training(1, [1, 2])
    side = server.method.side
    assert side.dim == 3 * 4 + 2 * (4 * 4 + 4 + 4 + 4)  # GCE (C, d), CoV's two branches
    assert all(ins.config[LAMBDA] == 0.5 and ins.config[MU] == 0.2 and MODULES in ins.config for ins in plan)
    with pytest.raises(AlgorithmOutputMissing, match=LOCAL_MODULES):
        server.check(RawReply(1, list(_arrays(1, 1).values()), None, 10, {}, {CLIENT_ALGORITHM: "gpfl"}))
    replies = [server.check(RawReply(c, list(_arrays(c, 10 * c).values()), None, n, {},
                                     {CLIENT_ALGORITHM: "gpfl", LOCAL_MODULES: encode_vector(torch.full((side.dim,), float(c)))}))
               for c, n in ((1, 30), (2, 10))]
    saved = copy.deepcopy(server.method.get_state())
    server.aggregate(1, replies)
    assert torch.allclose(side.vector, torch.full((side.dim,), 1.25))
    nxt = {ins.client_id: ins.model for ins in server.plan_training(2, [1, 2])}
    for c in (1, 2):
        assert torch.allclose(nxt[c][body_slice(layout)], torch.tensor(1.25)) and torch.all(nxt[c][head_slice(layout)] == 10 * c)
    assert server.method.evaluation_config()[MODULES] == encode_vector(side.vector)
    server.method.set_state(saved)
    assert torch.equal(server.method.side.vector, decode_flat(plan[0].config[MODULES], side.dim))


def test_short_run_as_recorded_and_the_valve_changes_it(short_runs, tmp_path):
    run, fedper = short_runs("gpfl"), short_runs("fedper")
    without_magnitude = short_run("gpfl", tmp_path, **{"gpfl-lambda": 0.0})
    assert run["train_loss"] != pytest.approx(without_magnitude["train_loss"], rel=1e-4)  # λ L_mlg trains the valve
    assert run["client_loss"] != pytest.approx(fedper["client_loss"], rel=1e-3)  # the valve and the guidance
    assert_as_recorded("gpfl", run)


# --- a round's clients as one computation ---------------------------------------------------------

@pytest.mark.parametrize("name", ["dnn", "dnn-bn"])
def test_a_rounds_clients_train_together_as_one_by_one(name):
    """The GCE and CoV trained beside each client's model; each client's conditional input from its own split."""
    model = build_model(name, (6,), 3)
    assert unbatched(GPFLClient, model) is None
    config = {**_config(), MODULES: encode_vector(flatten_module(built(gpfl_modules, 20, 3, seed=3)))}
    assert_together_is_one_by_one(model, (6,), lambda m, i: GPFLClient(m, config), same_vector_extras(LOCAL_MODULES))
