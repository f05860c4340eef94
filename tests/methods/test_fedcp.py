"""FedCP (Zhang et al. 2023): the MMD and the policy by hand, one client's steps against the paper's
formulas, the upload of the head, the server (shared extractor, personal heads, averaged side modules)
with fabricated replies, what it refuses, and a short run (the MMD and the policy change it)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from batching import assert_together_is_one_by_one, same_vector_extras
from torch import nn

from client_apps.own_loop import algorithm_for
from flower_pfl.engine.batched import unbatched
from flower_pfl.engine.client_algorithm import CLIENT_ALGORITHM, LR, SERVER_ROUND, TrainData, train_locally
from flower_pfl.engine.layout import ParamLayout, flatten_module
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.engine.minibatches import MinibatchStream
from flower_pfl.engine.model_split import body_slice, head_slice
from flower_pfl.engine.reply_checks import AlgorithmOutputMissing, RawReply
from flower_pfl.engine.side_modules import built
from flower_pfl.engine.wire import decode_flat, encode_vector, fingerprint
from flower_pfl.experiment.models import DNN, build_model
from flower_pfl.methods.fedcp import (
    BANDWIDTHS,
    HEAD_MIX,
    LAMBDA,
    LOCAL_MODULES,
    MODULES,
    FedCP,
    FedCPClient,
    Separated,
    cpn_modules,
    gumbel,
    mmd,
    policy,
)

from .runs import assert_as_recorded, short_run


def test_the_mmd_of_two_points_by_hand():
    x, y = torch.tensor([[0.0, 0.0]]), torch.tensor([[1.0, 0.0]])  # squared distance 1
    by_hand = 2 * len(BANDWIDTHS) - 2 * sum(math.exp(-0.5 / s) for s in BANDWIDTHS)
    assert float(mmd(x, y)) == pytest.approx(by_hand)
    assert float(mmd(x, x)) == 0.0


def test_the_policy_splits_each_feature_in_two_shares_by_hand():
    cpn = nn.Linear(1, 2, bias=False).requires_grad_(False)
    with torch.no_grad():
        cpn.weight.copy_(torch.tensor([[1.0], [-1.0]]))
    r, s = policy(cpn, torch.tensor([[2.0]]), torch.tensor([3.0]))  # v̂ = 1: logits (2, −2)
    assert float(r) == pytest.approx(1 / (1 + math.exp(-4))) and float(r + s) == pytest.approx(1.0)
    r, s = policy(cpn, torch.tensor([[2.0]]), torch.tensor([3.0]), noise=torch.tensor([[[0.0], [5.0]]]))
    assert float(r) == pytest.approx(1 / (1 + math.exp(1)))  # Gumbel noise added to the logits


def _model(seed: int = 0) -> DNN:
    torch.manual_seed(seed)
    return DNN(6, 3, hidden=4)


def _modules() -> nn.ModuleDict:
    return built(cpn_modules, 4, 3, seed=3)


def _config(lam: float = 2.0, mix: float = 0.25) -> dict:
    return {CLIENT_ALGORITHM: "fedcp", LAMBDA: lam, HEAD_MIX: mix, MODULES: encode_vector(flatten_module(_modules())), LR: 0.1,
            "local-steps": 3, "batch-size": 8, SERVER_ROUND: 4}


def _data() -> TrainData:
    torch.manual_seed(3)
    return TrainData(torch.randn(24, 6), torch.randint(0, 3, (24,)))


def test_the_clients_steps_follow_the_papers_loss_and_it_uploads_its_head_mixed():
    data, config, model, ref = _data(), _config(), _model(), _model()
    _, extras = train_locally(FedCPClient(model, config), model, data, steps=3, lr=0.1, batch_size=8,
                              generator=torch.Generator().manual_seed(5))
    modules, extractor = _modules(), copy.deepcopy(ref)
    global_head = [p.detach().clone() for p in modules["head"].parameters()]
    v = ref.fc2.weight.detach().sum(0)
    noise = None  # seeded by the first minibatch's data and the round (4)
    stream = MinibatchStream(24, 8, torch.Generator().manual_seed(5))
    params = list(ref.parameters()) + list(modules["cpn"].parameters())
    for _ in range(3):
        idx = stream.next()
        x, y = data.x[idx], data.y[idx]
        noise = noise or torch.Generator().manual_seed(fingerprint([x, y]) * 1_000_003 + 4)
        h = torch.relu(ref.fc1(x))
        z = modules["cpn"](h * v / v.norm()).view(8, 2, 4) + gumbel(torch.Size((8, 2, 4)), noise, torch.device("cpu"))
        r, s = torch.softmax(z, 1)[:, 0], torch.softmax(z, 1)[:, 1]
        logits = ref.fc2(h * r) + F.linear(h * s, *global_head)
        loss = F.cross_entropy(logits, y) + 2.0 * mmd(h, torch.relu(extractor.fc1(x)).detach())
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads):
                p.sub_(0.1 * g)
    assert torch.allclose(flatten_module(model), flatten_module(ref), atol=1e-6)
    returned = decode_flat(extras[LOCAL_MODULES], len(flatten_module(modules)))
    with torch.no_grad():
        modules["head"].weight.copy_(0.75 * ref.fc2.weight + 0.25 * global_head[0])
        modules["head"].bias.copy_(0.75 * ref.fc2.bias + 0.25 * global_head[1])
    assert torch.allclose(returned, flatten_module(modules), atol=1e-6)  # (1 − m) W_i + m W and the trained CPN
    assert extras[CLIENT_ALGORITHM] == "fedcp"


def test_the_mmd_weight_matters_and_evaluation_is_deterministic():
    data = _data()
    with_mmd, without = _model(), _model()
    for model, lam in ((with_mmd, 2.0), (without, 0.0)):
        train_locally(FedCPClient(model, _config(lam)), model, data, steps=3, lr=0.1, batch_size=8,
                      generator=torch.Generator().manual_seed(5))
    assert not torch.allclose(flatten_module(with_mmd), flatten_module(without), atol=1e-5)
    evaluated, metrics = FedCPClient.evaluation_model(with_mmd, _config(), None, data, lambda m: None)
    assert isinstance(evaluated, Separated) and metrics == {}
    assert torch.equal(evaluated(data.x), evaluated(data.x))


def test_a_users_loop_and_bad_values_are_refused():
    with pytest.raises(ValueError, match="client_apps.app"):
        algorithm_for(_config(), _model())
    with pytest.raises(ValueError, match="lambda"):
        FedCPClient(_model(), _config(-1.0))
    with pytest.raises(ValueError, match="head mix"):
        FedCPClient(_model(), _config(mix=1.5))
    with pytest.raises(ValueError, match="'fedcp-modules'"):
        FedCPClient(_model(), {k: v for k, v in _config().items() if k != MODULES})
    with pytest.raises(ValueError, match="fedcp-lambda"):
        FedCPClient(_model(), {CLIENT_ALGORITHM: "fedcp", LR: 0.1})
    with pytest.raises(ValueError, match="lam"):
        FedCP(lam=-0.5)
    with pytest.raises(ValueError, match="head_mix"):
        FedCP(head_mix=2.0)


def _arrays(body: float, head: float) -> dict:
    model = _model()
    layout = ParamLayout.from_module(model)
    flat = torch.empty(layout.dim)
    flat[body_slice(layout)], flat[head_slice(layout)] = body, head
    return {k: v.numpy() for k, v in layout.unflatten(flat).items()}


def test_the_server_shares_the_extractor_and_side_modules_and_keeps_each_head():
    model = _model()
    layout = ParamLayout.from_module(model)
    server = MethodServer(FedCP(lam=2.0), clients_per_round=2)
    server.initialize({k: v.numpy() for k, v in model.state_dict().items()})
    plan = server.plan_training(1, [1, 2])
    side = server.method.side
    assert all(ins.config[LAMBDA] == 2.0 and ins.config[HEAD_MIX] == 0.0 and ins.config[CLIENT_ALGORITHM] == "fedcp" for ins in plan)
    sent = decode_flat(plan[0].config[MODULES], side.dim)
    assert torch.equal(sent[:15], flatten_module(model)[head_slice(layout)])  # the global head starts as the model's
    with pytest.raises(AlgorithmOutputMissing, match=LOCAL_MODULES):
        server.check(RawReply(1, list(_arrays(1, 1).values()), None, 10, {}, {CLIENT_ALGORITHM: "fedcp"}))
    replies = [server.check(RawReply(c, list(_arrays(c, 10 * c).values()), None, n, {},
                                     {CLIENT_ALGORITHM: "fedcp", LOCAL_MODULES: encode_vector(torch.full((side.dim,), float(c)))}))
               for c, n in ((1, 10), (2, 30))]
    saved = copy.deepcopy(server.method.get_state())
    server.aggregate(1, replies)
    assert torch.allclose(side.vector, torch.full((side.dim,), 1.75))
    nxt = {ins.client_id: ins.model for ins in server.plan_training(2, [1, 2])}
    for c in (1, 2):
        assert torch.allclose(nxt[c][body_slice(layout)], torch.tensor(1.75)) and torch.all(nxt[c][head_slice(layout)] == 10 * c)
    fresh = MethodServer(FedCP(lam=2.0), clients_per_round=2)
    fresh.initialize({k: v.numpy() for k, v in model.state_dict().items()})
    fresh.method.set_state(saved)
    assert torch.equal(fresh.method.side.vector, sent)


def test_short_run_as_recorded_and_the_mmd_and_policy_change_it(short_runs, tmp_path):
    run, fedper = short_runs("fedcp"), short_runs("fedper")
    without_mmd = short_run("fedcp", tmp_path, **{"fedcp-lambda": 0.0})
    assert run["train_loss"] != pytest.approx(without_mmd["train_loss"], rel=1e-3)  # λ MMD² trains the extractor
    assert without_mmd["client_loss"] != pytest.approx(fedper["client_loss"], rel=1e-3)  # the policy and the global head
    assert_as_recorded("fedcp", run)


# --- a round's clients as one computation ---------------------------------------------------------

@pytest.mark.parametrize("name", ["dnn", "dnn-bn"])
def test_a_rounds_clients_train_together_as_one_by_one(name):
    """The CPN trained beside each client's model, each client's Gumbel noise from its own generator, its
    conditional input from its own head and its MMD against its own received extractor."""
    model = build_model(name, (6,), 3)
    assert unbatched(FedCPClient, model) is None
    config = {**_config(), MODULES: encode_vector(flatten_module(built(cpn_modules, 20, 3, seed=3)))}
    assert_together_is_one_by_one(model, (6,), lambda m, i: FedCPClient(m, config), same_vector_extras(LOCAL_MODULES))
