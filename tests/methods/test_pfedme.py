"""pFedMe (Dinh et al. 2020): the client's inner and outer steps by hand, β mixing on the
server through both Flower APIs and ``MethodServer``, the client algorithm in a user's own loop,
the personalized (PM) and global (GM) accuracies a client reports, pFedMe+MCSA (FedMCSA's
Table 2) as a run-config entry, and short whole runs of ``pfedme`` and ``pfedme+mcsa``."""

import fabricate as fb
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from batching import LR as BATCH_LR
from batching import assert_together_is_one_by_one
from floats import assert_same_math
from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict
from flwr.common import parameters_to_ndarrays
from torch import nn

import strategies
import strategies.message
from client_apps.app import Node
from client_apps.own_loop import RecordState, algorithm_for
from flower_pfl.engine.batched import unbatched
from flower_pfl.engine.client_algorithm import BATCH_SIZE, CLIENT_ALGORITHM, LOCAL_STEPS, LR, TrainData, train_locally
from flower_pfl.engine.client_metrics import GLOBAL_ACCURACY
from flower_pfl.engine.evaluation import EvalResult
from flower_pfl.engine.functional import Functional
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.engine.minibatches import MinibatchStream
from flower_pfl.engine.reply_checks import RawReply
from flower_pfl.experiment.config import ConfigError, ExperimentConfig
from flower_pfl.experiment.models import MLR, build_model
from flower_pfl.methods.pfedme import (
    INNER_STEPS,
    LAMBDA,
    PERSONAL_LR,
    THETA_STATE,
    PFedMe,
    PFedMeClient,
    personalize,
    personalized_vector,
)
from flower_pfl.methods.registry import client_algorithm_for
from server_apps.factory import build_message_strategy
from strategies.aggregated_metrics import PersonalizedMetrics

from .runs import assert_as_recorded


def _data():
    x = torch.randn(32, 3, generator=torch.Generator().manual_seed(0))
    return x, (x[:, 0] > 0).long()


def _config(*, lr=0.1, steps=2, lam=4.0, personal_lr=0.05, inner_steps=3):
    return {LR: lr, LOCAL_STEPS: steps, BATCH_SIZE: 8, CLIENT_ALGORITHM: "pfedme", LAMBDA: lam, PERSONAL_LR: personal_lr,
            INNER_STEPS: inner_steps}


def _flat(tensors) -> torch.Tensor:
    return torch.cat([torch.as_tensor(np.asarray(t.detach() if torch.is_tensor(t) else t)).flatten() for t in tensors])


# --- 1. the math, by hand -------------------------------------------------------------------------

def test_personalize_by_hand():
    """f(θ) = ½ (θ − 3)², λ = 2, step 0.1, from θ = w = 1: θ_1 = 1.2, θ_2 = 1.34; the loss is θ_1's;
    many steps reach the Moreau envelope's prox (3 + λ w) / (1 + λ) = 5/3."""
    model = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    loss_of = lambda out: 0.5 * ((out - 3.0) ** 2).sum()
    f = Functional(model)
    state = f.state()
    theta, loss, after = personalize(f, state, [model.weight.detach().clone()], loss_of, torch.ones(1, 1), lam=2.0,
                                     personal_lr=0.1, inner_steps=2)
    assert torch.allclose(theta[0], torch.tensor([[1.34]])) and torch.isclose(loss, torch.tensor(0.5 * 1.8 ** 2))
    assert model.weight.item() == 1.0 and after[0] is state[0]  # w is not touched
    theta, _, _ = personalize(f, state, theta, loss_of, torch.ones(1, 1), lam=2.0, personal_lr=0.1, inner_steps=200)
    assert torch.allclose(theta[0], torch.tensor([[5 / 3]]), atol=1e-5)


def test_personalized_vector_replaces_only_the_trainable_parameters():
    model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    model[1].bias.requires_grad_(False)
    trainable = [p for p in model.parameters() if p.requires_grad]
    theta = [torch.full_like(p, 7.0) for p in trainable]
    vector = personalized_vector(model, theta)
    state = model.state_dict()
    expected = {k: v.float() for k, v in state.items()}
    for name in ("0.weight", "0.bias", "1.weight"):
        expected[name] = torch.full_like(state[name], 7.0)
    assert vector.dtype == torch.float32 and torch.equal(vector, _flat(expected.values()))


def test_client_algorithms_by_hand():
    x, y = _data()
    torch.manual_seed(0)
    model, ref = MLR(3, 2), MLR(3, 2)
    ref.load_state_dict(model.state_dict())
    state = {}
    step = PFedMeClient(model, _config(), state)
    result, extras = train_locally(step, model, TrainData(x, y), steps=2, lr=0.1, batch_size=8,
                                   generator=torch.Generator().manual_seed(3))
    w = [p.detach().clone() for p in ref.parameters()]
    th = [p.clone() for p in w]
    stream = MinibatchStream(32, 8, torch.Generator().manual_seed(3))
    losses = []
    for _ in range(2):
        idx = stream.next()
        for _ in range(3):  # K steps on f(θ; D) + λ/2 ||θ − w||², no other term
            with torch.no_grad():
                for p, t in zip(ref.parameters(), th):
                    p.copy_(t)
            loss = F.cross_entropy(ref(x[idx]), y[idx])
            g = torch.autograd.grad(loss, list(ref.parameters()))
            th = [t - 0.05 * (gi + 4.0 * (t - wi)) for t, gi, wi in zip(th, g, w)]
        losses.append(float(loss.detach()))  # the loss pFedMe reports: θ's, at its last inner step
        pull = [4.0 * (wi - t) for wi, t in zip(w, th)]
        assert all(p.abs().sum() > 0 for p in pull)  # the regularizer really moves w
        w = [wi - 0.1 * p for wi, p in zip(w, pull)]  # w <- w − η λ (w − θ)
    for a, b in zip(model.parameters(), w):
        assert torch.allclose(a, b, atol=1e-6)
    for a, b in zip(step.theta, th):
        assert torch.allclose(a, b, atol=1e-6)
    assert extras == {CLIENT_ALGORITHM: "pfedme"} and np.isclose(result.loss, np.mean(losses), atol=1e-6)
    assert torch.allclose(state[THETA_STATE][0], _flat(th), atol=1e-6)  # θ_i kept (MLR's state_dict is its parameters)


# --- 2. the server algorithm, with fabricated replies -------------------------------------------------

def _arrays(weight: float, bias: float) -> dict[str, np.ndarray]:
    return {"fc.weight": np.full((2, 3), weight, np.float32), "fc.bias": np.full(2, bias, np.float32)}


@pytest.fixture
def _identity():
    fb.set_task_identity()


def test_method_server_mixes_with_beta_and_weights_by_samples():
    server = MethodServer(PFedMe(beta=0.5, lam=9.0), clients_per_round=2, seed=0)
    server.initialize(_arrays(2.0, 2.0))
    plan = server.plan_training(1, [7, 8, 9])
    assert all(ins.config == {CLIENT_ALGORITHM: "pfedme", LAMBDA: 9.0, PERSONAL_LR: 0.01, INNER_STEPS: 5} for ins in plan)
    replies = [server.check(RawReply(ins.client_id, list(_arrays(v, v).values()), None, n, {}))
               for ins, v, n in zip(plan, (4.0, 8.0), (10, 30))]
    new = server.aggregate(1, replies)
    assert torch.allclose(new, torch.full((8,), 0.5 * 2.0 + 0.5 * (10 * 4.0 + 30 * 8.0) / 40))  # (1 − β) w + β Σ n_i w_i / n
    assert all(ins.config == {CLIENT_ALGORITHM: "pfedme"} and torch.equal(ins.model, new)
               for ins in server.plan_evaluation(1, [7, 8, 9], 1.0))
    for beta in (0.0, 2.5):
        with pytest.raises(ValueError, match="beta"):
            PFedMe(beta=beta)
    with pytest.raises(ValueError, match="inner_steps"):
        PFedMe(inner_steps=0)


def test_message_server_mixes_with_beta(_identity):
    grid = fb.FakeGrid([1, 2])
    strat = strategies.message.PFedMe(beta=0.5, fraction_train=1.0, min_train_nodes=2, min_available_nodes=2)
    arrays = ArrayRecord({k: fb.Array(v) for k, v in _arrays(0.0, 0.0).items()})
    msgs = list(strat.configure_train(1, arrays, ConfigRecord({"lr": 0.1}), grid))
    assert all(m.content["config"]["pfedme-inner-steps"] == 5 and m.content["config"][CLIENT_ALGORITHM] == "pfedme" for m in msgs)
    replies = [fb.train_reply(m, _arrays(4.0, 2.0)) for m in msgs]
    new, _ = strat.aggregate_train(1, replies)
    assert np.allclose(new["fc.weight"].numpy(), 2.0) and np.allclose(new["fc.bias"].numpy(), 1.0)  # (1 − β)·0 + β·mean
    assert all(m.content["config"][CLIENT_ALGORITHM] == "pfedme" for m in strat.configure_evaluate(1, new, ConfigRecord(), grid))


def test_legacy_server_mixes_with_beta():
    cm = fb.client_manager(["1", "2"])
    strat = strategies.PFedMe(beta=1.5, initial_parameters=_arrays(1.0, 1.0), min_fit_clients=2, min_available_clients=2)
    ins = strat.configure_fit(1, strat.initial_parameters, cm)
    assert all(fi.config["pfedme-lambda"] == 15.0 and fi.config["server-round"] == 1 and fi.config[CLIENT_ALGORITHM] == "pfedme"
               for _, fi in ins)
    params, _ = strat.aggregate_fit(1, [(p, fb.fit_res(list(_arrays(3.0, 3.0).values()))) for p, _ in ins], [])
    assert np.allclose(_flat(parameters_to_ndarrays(params)), -0.5 * 1.0 + 1.5 * 3.0)  # β > 1 extrapolates
    assert all(fi.config[CLIENT_ALGORITHM] == "pfedme" for _, fi in strat.configure_evaluate(1, params, cm))


def test_pfedme_mcsa_is_fedmcsa_with_pfedmes_client_and_evaluation(_identity):
    """FedMCSA's Table 2: pFedMe+MCSA by run config, not by a new class."""
    cfg = ExperimentConfig(method="pfedme", aggregation="mcsa", options={"pfedme-lambda": 9.0})
    strat = build_message_strategy(cfg, 4)
    assert type(strat).__name__ == "FedMCSA" and strat.method.train_config(1) == {
        "pfedme-lambda": 9.0, "pfedme-personal-lr": 0.01, "pfedme-inner-steps": 5}
    arrays = ArrayRecord({k: fb.Array(v) for k, v in _arrays(0.0, 0.0).items()})
    msgs = list(strat.configure_train(1, arrays, ConfigRecord({"lr": 0.1}), fb.FakeGrid([1, 2, 3, 4])))
    assert msgs and all(client_algorithm_for(m.content["config"]) is PFedMeClient for m in msgs)  # pFedMe's client trains
    msgs = list(strat.configure_evaluate(1, arrays, ConfigRecord(), fb.FakeGrid([1, 2, 3, 4])))
    assert all(m.content["config"][CLIENT_ALGORITHM] == "pfedme" for m in msgs)  # the client reports θ_i
    assert all(client_algorithm_for(m.content["config"]) is PFedMeClient for m in msgs)


def test_other_table2_transfers_by_run_config(_identity):
    """The rest of FedMCSA's Table 2 (ported with pFedMe's old test): FedAvg+MCSA is FedMCSA with
    λ = 0; FedMCSA^-MCSA is FedProx with μ = λ; other combinations are refused."""
    fedavg = build_message_strategy(ExperimentConfig(method="fedavg", aggregation="mcsa"), 4)
    assert type(fedavg).__name__ == "FedMCSA" and fedavg.method.train_config(1) == {"proximal-mu": 0.0}
    with pytest.raises(ConfigError, match="'aggregation'"):
        ExperimentConfig.from_mapping({"method": "fedacs", "aggregation": "mcsa"})
    ablation = build_message_strategy(ExperimentConfig(method="fedmcsa", aggregation="mean", options={"lam": 5.0}), 4)
    assert type(ablation).__name__ == "FedProx" and ablation.proximal_mu == 5.0
    with pytest.raises(ConfigError, match="'aggregation'"):
        ExperimentConfig.from_mapping({"method": "fedavg", "aggregation": "mean"})


# --- 3. the client algorithm: the user's own loop, evaluation, the ClientApp's node -----------------------

def _smoothed(logits, y):
    """A user's own loss: pFedMe's inner problem must use it."""
    return F.cross_entropy(logits, y, label_smoothing=0.2)


def test_users_loop_matches_train_locally_with_the_users_loss():
    x, y = _data()
    torch.manual_seed(4)
    ours, theirs = MLR(3, 2), MLR(3, 2)
    theirs.load_state_dict(ours.state_dict())
    config = _config(steps=3)
    ours_state, their_state = {}, RecordDict()
    step = PFedMeClient(ours, config, ours_state, loss_fn=_smoothed)
    result, _ = train_locally(step, ours, TrainData(x, y), steps=3, lr=0.1, batch_size=8, generator=torch.Generator().manual_seed(1))
    optimizer = torch.optim.SGD(theirs.parameters(), lr=0.1)
    algorithm = algorithm_for(config, theirs, their_state, optimizer, loss_fn=_smoothed)
    stream = MinibatchStream(len(y), 8, torch.Generator().manual_seed(1))
    for _ in range(3):
        idx = stream.next()
        optimizer.zero_grad()
        _smoothed(theirs(x[idx]), y[idx]).backward()  # discarded: pFedMe's gradient is λ (w − θ)
        algorithm.adjust_gradients(theirs, (x[idx], y[idx]))
        optimizer.step()
    assert algorithm.finish(theirs, x) == {CLIENT_ALGORITHM: "pfedme"}
    assert_same_math(_flat(ours.parameters()), _flat(theirs.parameters()))
    assert_same_math(ours_state[THETA_STATE][0], RecordState(their_state)[THETA_STATE][0])
    plain = MLR(3, 2)
    plain.load_state_dict(theirs.state_dict())
    other = PFedMeClient(plain, config, {})
    batch = x[:8], y[:8]
    other.adjust_gradients(plain, batch)
    step_smoothed = PFedMeClient(plain, config, {}, loss_fn=_smoothed)
    step_smoothed.adjust_gradients(plain, batch)
    assert not torch.allclose(_flat(other.theta), _flat(step_smoothed.theta))  # the loss reaches the inner problem
    with pytest.raises(ValueError, match="minibatch"):
        algorithm.adjust_gradients(theirs)


def test_evaluation_model_is_theta_and_reports_the_global_accuracy():
    model = MLR(3, 2)
    received = _flat(model.parameters())
    seen = []

    def test(m):
        seen.append(_flat(m.parameters()))
        return EvalResult(loss=1.0, accuracy=0.25 * len(seen), num_examples=4)

    data = TrainData(*_data())
    same, extra = PFedMeClient.evaluation_model(model, {CLIENT_ALGORITHM: "pfedme"}, {}, data, test)
    assert same is model and extra == {GLOBAL_ACCURACY: 0.25} and torch.equal(_flat(model.parameters()), received)
    theta = torch.arange(8, dtype=torch.float32)
    personal, extra = PFedMeClient.evaluation_model(model, {CLIENT_ALGORITHM: "pfedme"}, {THETA_STATE: [theta]}, data, test)
    assert torch.equal(seen[-1], received) and extra == {GLOBAL_ACCURACY: 0.5}  # GM: the received model
    assert torch.equal(_flat(personal.state_dict().values()), theta)  # PM: θ_i


def test_node_reports_pm_and_gm_and_they_aggregate():
    state = RecordDict()
    context = Context(run_id=1, node_id=3, node_config={"partition-id": 0, "num-partitions": 4}, state=state,
                      run_config=ExperimentConfig().to_run_config())
    node = Node.from_context(context)
    received = [v.clone() for v in node.model.state_dict().values()]
    before = node.evaluate({CLIENT_ALGORITHM: "pfedme"})
    assert before["accuracy"] == before["global-accuracy"]  # no θ yet: PM is the global model
    node.fit({"lr": 0.05, "local-steps": 5, "batch-size": 20, "server-round": 1, CLIENT_ALGORITHM: "pfedme", "pfedme-lambda": 15.0,
              "pfedme-personal-lr": 0.05, "pfedme-inner-steps": 3})
    assert THETA_STATE in RecordState(state)
    node.load(received)
    after = node.evaluate({CLIENT_ALGORITHM: "pfedme"})
    assert after["global-accuracy"] == before["global-accuracy"] and after["loss"] != before["loss"]
    agg = PersonalizedMetrics().legacy([(10, {"accuracy": 0.8, "global-accuracy": 0.5, "loss": 1.0}),
                                        (30, {"accuracy": 0.6, "global-accuracy": 0.3, "loss": 1.0})])
    assert np.isclose(agg["global-accuracy-mean"], 0.4) and np.isclose(agg["global-accuracy"], 0.35)


@pytest.mark.parametrize("name", ["dnn", "dnn-bn"])
def test_a_round_s_clients_train_together_as_one_by_one(name):
    """Each client's θ_i (carried from step to step, from its received model) with the server's λ, ν and K:
    the models (running statistics after the K inner forward passes), losses and kept θ_i are the same both ways."""
    model = build_model(name, (6,), 3, seed=0)
    assert unbatched(PFedMeClient, model) is None
    config = {CLIENT_ALGORITHM: "pfedme", LR: BATCH_LR, **PFedMe().train_config(4)}
    made: list[dict] = []

    def make(m, i):
        made.append({})
        return PFedMeClient(m, config, made[-1])

    assert_together_is_one_by_one(model, (6,), make)
    assert len(made) == 8
    for alone, together in zip(made[:4], made[4:]):
        assert_same_math(together[THETA_STATE][0], alone[THETA_STATE][0])
    assert not torch.equal(made[0][THETA_STATE][0], made[1][THETA_STATE][0])


# --- 4. whole runs --------------------------------------------------------------------------------

@pytest.mark.parametrize("label", ["pfedme", "pfedme+mcsa"])
def test_short_run_as_recorded(label, short_runs):
    assert_as_recorded(label, short_runs(label))


def test_personalized_models_beat_the_global_ones(short_runs):
    """pFedMe's θ_i (PM) beat its own global model (GM, reported beside) and FedAvg's."""
    pfedme, fedavg = short_runs("pfedme"), short_runs("fedavg")
    assert pfedme["bmta"] > pfedme["bmta_global"] and pfedme["bmta"] > fedavg["bmta"]
    assert "bmta_global" in short_runs("pfedme+mcsa")  # pFedMe's evaluation travels with its client algorithm
