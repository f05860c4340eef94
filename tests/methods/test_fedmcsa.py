"""FedMCSA (Guo et al.) and its Table 2 transfers (fedavg+mcsa, fedmcsa+mean).

1. the layer-wise attention (eqs. 6-8) against hand-computed examples;
2. the server algorithm through both Flower APIs' strategies, driven with fabricated replies
   (each participant gets its own personalized model; Algorithm 1 with every client training);
3. the proximal client algorithm (eq. 9) with Algorithm 1's anchors, in a user's own loop and in
   the package's loop, against the objective's gradient written out here;
4. short whole runs as recorded, and the Table 2 ablation: the attention beats the plain mean.
"""

from __future__ import annotations

import math

import fabricate as fb
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from floats import assert_same_math
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from flwr.common import parameters_to_ndarrays

import strategies
import strategies.message
from client_apps.own_loop import RecordState, algorithm_for
from flower_pfl.engine.client_algorithm import CLIENT_ALGORITHM, PROXIMAL_MU, ClientAlgorithm, Proximal, TrainData, train_locally
from flower_pfl.engine.layout import ParamLayout
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.engine.minibatches import MinibatchStream
from flower_pfl.experiment.config import ExperimentConfig
from flower_pfl.experiment.models import build_model
from flower_pfl.methods.all_clients_train import ANCHOR, ANCHOR_KEEP, ANCHOR_SET, ANCHOR_STATE, AnchoredProximal
from flower_pfl.methods.attention import layerwise_attention
from flower_pfl.methods.fedmcsa import FedMCSA
from flower_pfl.methods.pfedme import PFedMe, PFedMeClient
from flower_pfl.methods.registry import client_algorithm_for, entry

from .runs import assert_as_recorded

NAMES, SHAPES = fb.NAMES, fb.SHAPES

_arrays, _flat, _sent = fb.model_arrays, fb.flat, fb.sent


@pytest.fixture(autouse=True)
def _identity():
    fb.set_task_identity()


# ---------------------------------------------------------------- 1. the attention by hand

TWO = ParamLayout(names=("fc.weight", "fc.bias"), shapes=((2,), (1,)))
#: client 0: w = [1, 0], b = [1]; client 1: w = [0, 1], b = [2]
MODELS = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 2.0]])


def test_tensor_components_by_hand():
    """σ = ln 3: the weights are orthogonal (cos 0, own cos 1): softmax(ln3·[1, 0]) = [3/4, 1/4];
    the biases are parallel (cos 1 everywhere): the plain mean 1.5."""
    out, weights = FedMCSA(sigma=math.log(3.0)).personalize(MODELS, TWO)
    assert torch.allclose(out, torch.tensor([[0.75, 0.25, 1.5], [0.25, 0.75, 1.5]]))
    assert set(weights) == {"fc.weight", "fc.bias"}
    assert torch.allclose(weights["fc.weight"], torch.tensor([[0.75, 0.25], [0.25, 0.75]]))
    assert torch.allclose(weights["fc.bias"], torch.full((2, 2), 0.5))


def test_module_components_by_hand():
    """``grouping = module``: ``fc.weight`` and ``fc.bias`` are one component, cos = 2/√10."""
    sigma = 2.0
    own, other = math.exp(sigma), math.exp(sigma * 2 / math.sqrt(10))
    a = own / (own + other)
    out, weights = FedMCSA(sigma=sigma, grouping="module").personalize(MODELS, TWO)
    assert list(weights) == ["fc"]
    assert torch.allclose(weights["fc"], torch.tensor([[a, 1 - a], [1 - a, a]]), atol=1e-6)
    assert torch.allclose(out, torch.tensor([[a, 1 - a], [1 - a, a]]) @ MODELS, atol=1e-6)


def test_sigma_limits_mean_and_own_model():
    torch.manual_seed(0)
    layout = ParamLayout.from_arrays(_arrays(0.0))
    models = torch.randn(5, layout.dim)
    mean, _ = FedMCSA(sigma=1e-7).personalize(models, layout)
    assert torch.allclose(mean, models.mean(0).expand(5, -1), atol=1e-5)
    own, _ = FedMCSA(sigma=1e6).personalize(models, layout)
    assert torch.allclose(own, models, atol=1e-5)
    # and the method is exactly the attention function over the layout's components
    out, _ = FedMCSA(sigma=3.0).personalize(models, layout)
    assert torch.equal(out, layerwise_attention(models, [sl for _, sl in layout.components("tensor")], 3.0)[0])


def test_client_settings_and_validation():
    assert FedMCSA(lam=2.5).train_config(1) == {PROXIMAL_MU: 2.5}
    assert FedMCSA().evaluation_config() == {}
    pfedme = PFedMe()
    transfer = FedMCSA(client_method=pfedme)
    assert transfer.train_config(1) == pfedme.train_config(1) and transfer.evaluation_config() == pfedme.evaluation_config()
    assert transfer.client_algorithm() is PFedMeClient and FedMCSA().client_algorithm() is Proximal
    assert FedMCSA(all_clients_train=True).client_algorithm() is AnchoredProximal  # remembers its anchor
    assert FedMCSA(lam=0.0).client_algorithm() is ClientAlgorithm  # FedAvg+MCSA: plain local SGD
    for bad, name in (({"sigma": 0.0}, "sigma"), ({"lam": -1.0}, "lam"), ({"grouping": "layer"}, "grouping")):
        with pytest.raises(ValueError, match=name):
            FedMCSA(**bad)


# ---------------------------------------------------------------- 2. the server algorithm (Message API)

def _message_strategy(sigma=50.0, lam=5.0, k=3, seed=0, all_clients_train=False):
    return strategies.message.FedMCSA(sigma=sigma, lam=lam, clients_per_round=k, min_available_nodes=1, seed=seed,
                                      all_clients_train=all_clients_train)


def _run_round(strategy, grid, rnd, make_reply):
    msgs = list(strategy.configure_train(rnd, ArrayRecord({n: fb.Array(a) for n, a in _arrays(0.0).items()}),
                                         ConfigRecord({"lr": 0.1, "local-steps": 2, "batch-size": 4}), grid))
    return msgs, strategy.aggregate_train(rnd, [make_reply(m) for m in msgs])


def test_each_client_gets_its_own_personalized_model_and_settings():
    grid = fb.FakeGrid(range(10, 16))
    strat = _message_strategy(sigma=50.0, lam=2.5, k=4)
    for rnd in (1, 2, 3):  # every node trains to a distinct model (value = node id)
        _run_round(strat, grid, rnd, lambda m: fb.train_reply(m, _arrays(float(m.metadata.dst_node_id))))
    msgs = list(strat.configure_train(4, ArrayRecord(), ConfigRecord({"lr": 0.1}), grid))
    ids = [m.metadata.dst_node_id for m in msgs]
    assert len(ids) == 4 == len(set(ids)) and set(ids) <= set(grid.node_ids)
    assert ids == strat.server.last_participants
    stored = strat.method.store.get(ids)
    expected, _ = layerwise_attention(stored, [sl for _, sl in strat.server.layout.components("tensor")], 50.0)
    assert not torch.allclose(expected, stored, atol=1e-3)  # the attention mixes: the check below can fail
    for i, msg in enumerate(msgs):
        assert torch.allclose(_sent(msg), expected[i])
        assert list(msg.content["arrays"].keys()) == list(NAMES)
        cfg = msg.content["config"]
        assert cfg["proximal-mu"] == 2.5 and cfg["lr"] == 0.1 and cfg["server-round"] == 4
        assert cfg[CLIENT_ALGORITHM] == "proximal"
        assert ANCHOR not in cfg  # only Algorithm 1 with every client training sets anchors


def test_all_clients_train_as_algorithm_1():
    """Sampled clients get the attention output and set their anchor; the others continue from
    their own stored model and keep their anchor; every reply updates the store."""
    grid = fb.FakeGrid(range(10, 16))
    strat = _message_strategy(sigma=50.0, k=2, all_clients_train=True)
    msgs, (_, metrics) = _run_round(strat, grid, 1, lambda m: fb.train_reply(m, _arrays(float(m.metadata.dst_node_id))))
    assert sorted(m.metadata.dst_node_id for m in msgs) == list(grid.node_ids) and metrics["clients-accepted"] == 6
    msgs = list(strat.configure_train(2, ArrayRecord(), ConfigRecord(), grid))
    sampled = [m.metadata.dst_node_id for m in msgs if m.content["config"][ANCHOR] == ANCHOR_SET]
    others = [m for m in msgs if m.content["config"][ANCHOR] == ANCHOR_KEEP]
    assert len(sampled) == 2 and len(others) == 4 and sampled == strat.server.last_participants
    expected, _ = layerwise_attention(strat.method.store.get(sampled), [sl for _, sl in strat.server.layout.components("tensor")], 50.0)
    for m in msgs:
        nid = m.metadata.dst_node_id
        want = expected[sampled.index(nid)] if nid in sampled else _flat(_arrays(float(nid)))
        assert torch.allclose(_sent(m), want, atol=1e-5)
        assert m.content["config"]["proximal-mu"] == 5.0 and m.content["config"][CLIENT_ALGORITHM] == "anchored-proximal"


def test_large_sigma_sends_each_client_its_own_model_back():
    grid = fb.FakeGrid(range(4))
    strat = _message_strategy(sigma=1e6, k=4)
    _run_round(strat, grid, 1, lambda m: fb.train_reply(m, _arrays(1.0 + m.metadata.dst_node_id)))
    for msg in strat.configure_train(2, ArrayRecord(), ConfigRecord(), grid):
        assert torch.allclose(_sent(msg), _flat(_arrays(1.0 + msg.metadata.dst_node_id)), atol=1e-5)


def test_store_updates_only_participants():
    grid = fb.FakeGrid(range(6))
    strat = _message_strategy(k=2)
    msgs, (arrays, metrics) = _run_round(strat, grid, 1, lambda m: fb.train_reply(m, _arrays(7.0)))
    assert arrays is None and metrics["clients-accepted"] == 2  # personalized: no global model
    trained = {m.metadata.dst_node_id for m in msgs}
    for node in grid.node_ids:
        assert torch.allclose(strat.method.store.get([node])[0], _flat(_arrays(7.0 if node in trained else 0.0)))


def test_attention_weights_are_recorded_per_component():
    grid = fb.FakeGrid(range(4))
    strat = _message_strategy(sigma=2.0, k=4)
    _run_round(strat, grid, 1, lambda m: fb.train_reply(m, _arrays(float(m.metadata.dst_node_id))))
    msgs = list(strat.configure_train(2, ArrayRecord(), ConfigRecord(), grid))
    ids = [m.metadata.dst_node_id for m in msgs]
    _, weights = layerwise_attention(strat.method.store.get(ids), [sl for _, sl in strat.server.layout.components("tensor")], 2.0)
    rounds = strat.method.attention_weights.rounds
    assert len(rounds) == 2
    _, first = rounds[0]  # round 1: every stored model is the initial one: uniform weights
    assert sorted(first) == sorted(NAMES) and all(np.allclose(w, 0.25) for w in first.values())
    last_ids, last = rounds[1]
    assert last_ids == ids
    for l, component in enumerate(NAMES):
        assert np.allclose(last[component], weights[l].numpy(), atol=1e-6)
    order, mean = strat.method.attention_weights.mean()
    index = [order.index(i) for i in ids]
    assert np.allclose(mean["fc.bias"][np.ix_(index, index)], (weights[1].numpy() + 0.25) / 2, atol=1e-6)


# ---------------------------------------------------------------- 2. the server algorithm (legacy API)

def _legacy_strategy(sigma=1e6, k=3, **kw):
    return strategies.FedMCSA(sigma=sigma, lam=5.0, initial_parameters=_arrays(0.0), clients_per_round=k,
                              min_available_clients=1, on_fit_config_fn=lambda r: {"lr": 0.1, "local-steps": 3, "batch-size": 4},
                              **kw)


def test_legacy_right_model_to_right_client_and_store_updates():
    cm = fb.client_manager([str(i) for i in range(5)])
    strat = _legacy_strategy(k=5)
    assert strat.initialize_parameters(cm) is strat.initial_parameters
    assert strat.server.layout.names == NAMES  # the named initial model keeps its names
    ins = strat.configure_fit(1, strat.initial_parameters, cm)
    assert sorted(p.cid for p, _ in ins) == ["0", "1", "2", "3", "4"]
    assert all(fi.config["proximal-mu"] == 5.0 and fi.config["local-steps"] == 3 and fi.config["server-round"] == 1
               and fi.config[CLIENT_ALGORITHM] == "proximal" for _, fi in ins)
    params, metrics = strat.aggregate_fit(1, [(p, fb.fit_res(list(_arrays(1.0 + int(p.cid)).values()))) for p, _ in ins], [])
    assert params is None and metrics["clients-accepted"] == 5
    for node in range(5):  # legacy client ids are the node ids as ints
        assert torch.equal(strat.method.store.get([node])[0], _flat(_arrays(1.0 + node)))
    for proxy, fitins in strat.configure_fit(2, strat.initial_parameters, cm):  # sigma = 1e6: own model back
        assert torch.allclose(_flat(parameters_to_ndarrays(fitins.parameters)), _flat(_arrays(1.0 + int(proxy.cid))), atol=1e-5)
    for proxy, evalins in strat.configure_evaluate(2, strat.initial_parameters, cm):
        assert torch.allclose(_flat(parameters_to_ndarrays(evalins.parameters)), _flat(_arrays(1.0 + int(proxy.cid))))


def test_legacy_attention_mixes_like_the_message_api():
    cm = fb.client_manager([str(i) for i in range(4)])
    strat = _legacy_strategy(sigma=2.0, k=4)
    ins = strat.configure_fit(1, strat.initial_parameters, cm)
    strat.aggregate_fit(1, [(p, fb.fit_res(list(_arrays(float(p.cid)).values()))) for p, _ in ins], [])
    ins = strat.configure_fit(2, strat.initial_parameters, cm)
    ids = [int(p.cid) for p, _ in ins]
    expected, _ = layerwise_attention(strat.method.store.get(ids), [sl for _, sl in strat.server.layout.components("tensor")], 2.0)
    for i, (_, fitins) in enumerate(ins):
        assert torch.allclose(_flat(parameters_to_ndarrays(fitins.parameters)), expected[i], atol=1e-6)


def test_strategy_arguments_go_to_the_method_and_bad_ones_are_refused():
    strat = strategies.message.FedMCSA(sigma=7.0, lam=0.5, grouping="module", clients_per_round=4)
    assert isinstance(strat.method, FedMCSA)
    assert (strat.method.sigma, strat.method.lam, strat.method.grouping, strat.server.clients_per_round) == (7.0, 0.5, "module", 4)
    assert strategies.message.FedMCSA().server.clients_per_round == FedMCSA.default_clients_per_round
    with pytest.raises(TypeError, match="sigmaa"):
        strategies.message.FedMCSA(sigmaa=1.0)
    with pytest.raises(ValueError, match="sigma"):
        strategies.FedMCSA(sigma=-1.0, initial_parameters=_arrays(0.0))


def _asked(method: FedMCSA) -> tuple[type[ClientAlgorithm], type[ClientAlgorithm]]:
    """The client algorithms the method's training and evaluation instructions name."""
    server = MethodServer(method, clients_per_round=1)
    server.initialize(_arrays(0.0))
    (train,), (evaluation,) = server.plan_training(1, [1]), server.plan_evaluation(1, [1], 1.0)
    return client_algorithm_for(train.config), client_algorithm_for(evaluation.config)


def test_table_2_entries():
    """fedavg+mcsa: the attention with λ = 0 (plain local SGD); fedmcsa+mean: Flower's FedProx with
    μ = λ; pfedme+mcsa: the attention with pFedMe's client algorithm and evaluation."""
    run = {"fedmcsa-lambda": 3.0}
    cfg = ExperimentConfig.from_mapping({"method": "fedavg", "aggregation": "mcsa", **run})
    method = FedMCSA(**cfg.method_arguments())
    assert cfg.entry.declaration is FedMCSA and method.lam == 0.0
    assert _asked(method) == (ClientAlgorithm, ClientAlgorithm)
    assert _asked(FedMCSA(lam=3.0)) == (Proximal, Proximal)

    cfg = ExperimentConfig.from_mapping({"method": "fedmcsa", "aggregation": "mean", **run})
    assert cfg.entry.strategy == "FedProx" and cfg.method_arguments() == {"proximal_mu": 3.0}
    assert entry("fedmcsa", "mean").builtin

    cfg = ExperimentConfig.from_mapping({"method": "pfedme", "aggregation": "mcsa"})
    method = FedMCSA(**cfg.method_arguments())
    assert _asked(method) == (PFedMeClient, PFedMeClient)


# ---------------------------------------------------------------- 3. the client algorithm (eq. 9, Algorithm 1)

LR, STEPS, BATCH, LAM = 0.1, 4, 8, 3.0


def _data(node: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + node)
    return torch.randn(30, 6, generator=g), torch.randint(0, 3, (30,), generator=g)


def _model(arrays) -> torch.nn.Module:
    model = build_model("dnn", (6,), 3, hidden_units=5, seed=1)
    model.load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in arrays.items()})
    return model


def _params(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def _reference(model, anchor: list[torch.Tensor], x, y, seed: int) -> None:
    """Eq. 9 written out: SGD on ``CE + λ/2 ||w − a||²`` by autograd, the anchor fixed."""
    stream = MinibatchStream(len(y), BATCH, torch.Generator().manual_seed(seed))
    params = list(model.parameters())
    for _ in range(STEPS):
        idx = stream.next()
        loss = F.cross_entropy(model(x[idx]), y[idx]) + LAM / 2 * sum(((p - a) ** 2).sum() for p, a in zip(params, anchor))
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads):
                p -= LR * g


def _user_loop(model, step, x, y, seed: int) -> dict:
    return fb.user_loop(model, step, x, y, lr=LR, batch_size=BATCH, steps=STEPS, seed=seed)


def test_algorithm_1_clients_in_a_users_loop_and_in_the_package_loop():
    """Three nodes, one sampled a round, all training (Algorithm 1). Every instruction the server
    sends gives, in a user's loop and in ``train_locally``, the same model, which is eq. 9's SGD
    with the right anchor: the received model when sampled (and remembered), the remembered one
    when not sampled (a node never sampled yet: the model it received)."""
    start = build_model("dnn", (6,), 3, hidden_units=5, seed=1).state_dict()
    grid = fb.FakeGrid([0, 1, 2])
    strat = strategies.message.FedMCSA(sigma=5.0, lam=LAM, clients_per_round=1, min_available_nodes=1, seed=3,
                                       all_clients_train=True)
    states = {n: RecordDict() for n in grid.node_ids}
    remembered: dict[int, list[torch.Tensor]] = {}
    kept_anchor_used = False
    for rnd in (1, 2, 3):
        msgs = list(strat.configure_train(rnd, ArrayRecord({k: fb.Array(v.numpy()) for k, v in start.items()}),
                                          ConfigRecord({"lr": LR, "local-steps": STEPS, "batch-size": BATCH}), grid))
        replies = []
        for msg in msgs:
            node, config = msg.metadata.dst_node_id, dict(msg.content["config"])
            received = {k: v.numpy() for k, v in msg.content["arrays"].items()}
            x, y = _data(node)
            mode = config[ANCHOR]
            anchor = remembered.get(node) if mode == ANCHOR_KEEP else None
            kept_anchor_used |= anchor is not None and not torch.allclose(_flat(anchor), _flat(received))
            anchor = [torch.as_tensor(a).clone() for a in received.values()] if anchor is None else anchor
            if mode == ANCHOR_SET:
                remembered[node] = [torch.as_tensor(a).clone() for a in received.values()]

            reference = _model(received)
            _reference(reference, anchor, x, y, seed=rnd)

            users, state = _model(received), states[node]
            package, package_state = _model(received), {k: list(v) for k, v in RecordState(state).items()}
            step = algorithm_for(config, users, state, optimizer=torch.optim.SGD(users.parameters(), lr=LR))
            assert isinstance(step, AnchoredProximal) and step.mu == LAM
            assert _user_loop(users, step, x, y, seed=rnd) == {CLIENT_ALGORITHM: "anchored-proximal"}  # the receipt only

            pstep = client_algorithm_for(config)(package, config, package_state)
            _, extras = train_locally(pstep, package, TrainData(x, y), steps=STEPS, lr=LR, batch_size=BATCH,
                                      generator=torch.Generator().manual_seed(rnd))
            assert extras == {CLIENT_ALGORITHM: "anchored-proximal"}
            assert_same_math(_params(users), _params(package))
            assert torch.allclose(_params(users), _params(reference), atol=1e-5)
            # the anchor the client remembers is the last model it received while sampled
            if node in remembered:
                kept = _flat(RecordState(state)[ANCHOR_STATE])
                assert torch.equal(kept, _flat(remembered[node])) and torch.equal(_flat(package_state[ANCHOR_STATE]), kept)
            replies.append(fb.train_reply(msg, {k: v.detach().numpy() for k, v in users.state_dict().items()}, num_examples=30))
        strat.aggregate_train(rnd, replies)
    assert kept_anchor_used  # some round had a node train toward an anchor other than what it received


# ---------------------------------------------------------------- 4. whole runs

@pytest.mark.parametrize("label", ["fedmcsa", "fedavg+mcsa", "fedmcsa+mean"])
def test_short_run_as_recorded(label, short_runs):
    assert_as_recorded(label, short_runs(label))


def test_attention_beats_the_plain_mean(short_runs):
    """Table 2's ablation: FedMCSA's attention against FedMCSA with the plain mean (FedProx, μ = λ),
    and the attention with plain local SGD against FedAvg."""
    assert short_runs("fedmcsa")["bmta"] > short_runs("fedmcsa+mean")["bmta"] + 0.05
    assert short_runs("fedavg+mcsa")["bmta"] > short_runs("fedavg")["bmta"] + 0.05
