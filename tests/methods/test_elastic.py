"""Elastic aggregation (Chen et al. 2023): the sensitivity and the elastic coefficients by hand, the
client (plain SGD plus the sensitivity's moving average) in the package's loop and a user's, batch
norm left alone, the server with fabricated replies, what it refuses, and a short run (one client per
round and τ = 1: FedAvg)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from batching import LR as BATCH_LR
from batching import assert_together_is_one_by_one
from floats import assert_same_math, same_math

from client_apps.own_loop import algorithm_for
from flower_pfl.engine.batched import unbatched
from flower_pfl.engine.client_algorithm import CLIENT_ALGORITHM, LR, ClientAlgorithm, TrainData, train_locally
from flower_pfl.engine.layout import ParamLayout, flatten_module
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.engine.minibatches import MinibatchStream
from flower_pfl.engine.reply_checks import RawReply, UpdateRejected
from flower_pfl.engine.wire import decode_flat, encode_vector
from flower_pfl.experiment.models import ConvNet, build_model
from flower_pfl.methods.elastic import MU, SENSITIVITY, Elastic, ElasticClient, elastic_coefficients, output_sensitivity

from .runs import assert_as_recorded, short_run


def test_the_sensitivity_is_the_absolute_gradient_of_the_outputs_squared_norm_by_hand():
    model = torch.nn.Linear(2, 2)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, -1.0], [0.0, 2.0]]))
        model.bias.copy_(torch.tensor([0.5, -1.0]))
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    out = x @ model.weight.T + model.bias  # [[1.5, -1], [-0.5, 1]]
    # ∂ mean_n ||f(x_n)||² / ∂W = mean_n 2 f(x_n) x_nᵀ, ∂ / ∂b = mean_n 2 f(x_n)
    weight, bias = output_sensitivity(model, x)
    assert weight.tolist() == (2 * out.T @ x / 2).abs().tolist() == [[1.5, 0.5], [1.0, 1.0]]
    assert bias.tolist() == (2 * out.mean(0)).abs().tolist() == [1.0, 0.0]


def test_elastic_coefficients_by_hand():
    sensitivities = torch.tensor([[1.0, 0.0, 2.0], [3.0, 0.0, 2.0]])
    zeta = elastic_coefficients(sensitivities, torch.tensor([0.25, 0.75]), tau=0.5)
    # Ω = [2.5, 0, 2], Ω_max = [3, 0, 2]: ζ = 1.5 − Ω / Ω_max, 1 where Ω_max = 0
    assert zeta.tolist() == pytest.approx([1.5 - 2.5 / 3, 1.0, 0.5])
    one = elastic_coefficients(torch.tensor([[4.0, 1.0]]), torch.tensor([1.0]), tau=0.3)
    assert one.tolist() == pytest.approx([0.3, 0.3])  # one client: Ω = Ω_max, so ζ = τ


def _data(n: int = 24) -> TrainData:
    torch.manual_seed(3)
    return TrainData(torch.randn(n, 4), torch.randint(0, 3, (n,)))


def _config(mu: float = 0.9) -> dict:
    return {CLIENT_ALGORITHM: "elastic", MU: mu, LR: 0.1, "local-steps": 3, "batch-size": 8}


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))


def test_the_client_trains_plain_sgd_and_returns_the_moving_average_of_the_sensitivity():
    data, model, ref = _data(), _model(), _model()
    _, extras = train_locally(ElasticClient(model, _config(0.9)), model, data, steps=3, lr=0.1, batch_size=8,
                              generator=torch.Generator().manual_seed(5))
    stream = MinibatchStream(len(data.y), 8, torch.Generator().manual_seed(5))
    optimizer = torch.optim.SGD(ref.parameters(), lr=0.1)
    omega = [torch.zeros_like(p) for p in ref.parameters()]
    for _ in range(3):
        idx = stream.next()
        grads = torch.autograd.grad(ref(data.x[idx]).pow(2).sum(1).mean(), list(ref.parameters()))
        omega = [0.9 * o + 0.1 * g.abs() for o, g in zip(omega, grads)]  # before the step, on the step's minibatch
        optimizer.zero_grad()
        F.cross_entropy(ref(data.x[idx]), data.y[idx]).backward()
        optimizer.step()
    assert_same_math(flatten_module(model), flatten_module(ref))
    assert extras[CLIENT_ALGORITHM] == "elastic"
    assert_same_math(decode_flat(extras[SENSITIVITY], flatten_module(model).numel()), torch.cat([o.flatten() for o in omega]))


def test_in_a_users_loop_it_is_the_same_and_it_needs_the_batch_and_mu():
    data, config = _data(), _config(0.5)
    model, mine = _model(), _model()
    _, expected = train_locally(ElasticClient(model, config), model, data, steps=3, lr=0.1, batch_size=8, generator=torch.Generator().manual_seed(5))
    algorithm = algorithm_for(config, mine)
    assert isinstance(algorithm, ElasticClient)
    optimizer, stream = torch.optim.SGD(mine.parameters(), lr=0.1), MinibatchStream(len(data.y), 8, torch.Generator().manual_seed(5))
    for _ in range(3):
        idx = stream.next()
        optimizer.zero_grad()
        F.cross_entropy(mine(data.x[idx]), data.y[idx]).backward()
        algorithm.adjust_gradients(mine, (data.x[idx], data.y[idx]))
        optimizer.step()
    theirs = algorithm.finish(mine)
    assert theirs[CLIENT_ALGORITHM] == expected[CLIENT_ALGORITHM] == "elastic"
    size = flatten_module(mine).numel()
    assert_same_math(decode_flat(theirs[SENSITIVITY], size), decode_flat(expected[SENSITIVITY], size))
    assert_same_math(flatten_module(mine), flatten_module(model))
    with pytest.raises(ValueError, match="adjust_gradients\\(model, \\(x, y\\)\\)"):
        algorithm.adjust_gradients(mine)
    with pytest.raises(ValueError, match="at least one step"):
        ElasticClient(mine, config).finish(mine)
    with pytest.raises(ValueError, match="mu must be in"):
        ElasticClient(mine, _config(1.0))
    with pytest.raises(ValueError, match="elastic-mu"):
        ElasticClient(mine, {CLIENT_ALGORITHM: "elastic", LR: 0.1})


def test_with_batch_norm_the_statistics_move_as_in_plain_sgd_and_buffers_have_no_sensitivity():
    torch.manual_seed(0)
    data = TrainData(torch.randn(16, 1, 16, 16), torch.randint(0, 3, (16,)))
    model = ConvNet((1, 16, 16), 3, channels=(2, 3), hidden=(4,), batch_norm=True)
    plain = ConvNet((1, 16, 16), 3, channels=(2, 3), hidden=(4,), batch_norm=True)
    plain.load_state_dict(model.state_dict())
    _, extras = train_locally(ElasticClient(model, _config()), model, data, steps=2, lr=0.1, batch_size=8, generator=torch.Generator().manual_seed(1))
    train_locally(ClientAlgorithm(plain, _config()), plain, data, steps=2, lr=0.1, batch_size=8, generator=torch.Generator().manual_seed(1))
    assert_same_math(flatten_module(model), flatten_module(plain))  # running statistics too
    layout = ParamLayout.from_module(model)
    sensitivity = layout.unflatten(decode_flat(extras[SENSITIVITY], layout.dim))
    params = dict(model.named_parameters())
    assert all((sensitivity[n] == 0).all() for n in layout.names if n not in params)  # running statistics, batch counters
    assert all((sensitivity[n] > 0).any() for n in params)


@pytest.mark.parametrize("name", ["dnn", "dnn-bn"])
def test_a_round_s_clients_train_together_as_one_by_one(name):
    """The models, losses and sensitivities Ω_k (carried from step to step) are the same both ways."""
    model = build_model(name, (6,), 3, seed=0)
    assert unbatched(ElasticClient, model) is None
    config = {CLIENT_ALGORITHM: "elastic", LR: BATCH_LR, **Elastic(mu=0.8).train_config(4)}

    def same_extras(alone: dict, together: dict) -> None:
        assert together.keys() == alone.keys() and together[CLIENT_ALGORITHM] == "elastic"
        size = len(alone[SENSITIVITY]) // 4
        assert_same_math(decode_flat(together[SENSITIVITY], size), decode_flat(alone[SENSITIVITY], size))
        assert decode_flat(alone[SENSITIVITY], size).abs().sum() > 0

    assert_together_is_one_by_one(model, (6,), lambda m, i: ElasticClient(m, config), same_extras)


SHAPES = {"w": (2, 2), "b": (2,)}


def _server(tau: float = 0.5) -> MethodServer:
    server = MethodServer(Elastic(tau=tau), clients_per_round=2, seed=0)
    server.initialize({k: np.ones(s, np.float32) for k, s in SHAPES.items()})
    return server


def _raw(cid: int, model: torch.Tensor, n: int, extras: dict) -> RawReply:
    return RawReply(cid, [model[:4].reshape(2, 2).numpy(), model[4:].numpy()], None, n, {}, extras)


def test_the_server_scales_the_averaged_update_per_parameter_by_hand():
    server = _server(tau=0.5)
    plan = server.plan_training(1, [1, 2])
    assert all(ins.config == {CLIENT_ALGORITHM: "elastic", MU: 0.95} for ins in plan)
    omega = {1: torch.tensor([1.0, 0, 2, 4, 0, 1]), 2: torch.tensor([3.0, 0, 2, 0, 0, 3])}
    models = {1: torch.full((6,), 3.0), 2: torch.full((6,), -1.0)}
    replies = [server.check(_raw(c, models[c], n, {SENSITIVITY: encode_vector(omega[c]), CLIENT_ALGORITHM: "elastic"}))
               for c, n in ((1, 10), (2, 30))]
    new = server.aggregate(1, replies)
    mean_update = 0.25 * (3.0 - 1.0) + 0.75 * (-1.0 - 1.0)  # -1.0 for every parameter
    omega_mean = 0.25 * omega[1] + 0.75 * omega[2]
    top = torch.maximum(omega[1], omega[2])
    zeta = torch.where(top > 0, 1.5 - omega_mean / torch.where(top > 0, top, 1.0), 1.0)
    torch.testing.assert_close(new, 1.0 + zeta * mean_update)
    assert new.tolist() == pytest.approx([1 - (1.5 - 2.5 / 3), 0.0, 0.5, 1 - (1.5 - 0.25), 0.0, 1 - (1.5 - 2.5 / 3)])


@pytest.mark.parametrize("extras,match", [
    ({}, "lacks 'elastic-sensitivity'"),
    ({SENSITIVITY: encode_vector(torch.tensor([1.0, float("nan"), 0, 0, 0, 0]))}, "NaN or Inf"),
    ({SENSITIVITY: encode_vector(torch.tensor([1.0, -1.0, 0, 0, 0, 0]))}, "negative"),
    ({SENSITIVITY: encode_vector(torch.ones(5))}, "expected 6 float32 values"),
])
def test_a_reply_without_a_valid_sensitivity_is_refused(extras, match):
    server = _server()
    server.plan_training(1, [1, 2])
    with pytest.raises(UpdateRejected, match=match):
        server.check(_raw(1, torch.ones(6), 10, extras))
    with pytest.raises(ValueError, match="tau = -0.1 is invalid"):
        Elastic(tau=-0.1)
    with pytest.raises(ValueError, match="mu = 1.0 is invalid"):
        Elastic(mu=1.0)


def test_short_run_as_recorded_and_with_one_client_per_round_and_tau_one_it_is_fedavg(short_runs, tmp_path):
    run, fedavg = short_runs("elastic"), short_runs("fedavg")
    assert run["train_loss"] != pytest.approx(fedavg["train_loss"], rel=1e-3)  # ζ changes the aggregation
    one = {"clients-per-round": 1}
    elastic = short_run("elastic", tmp_path / "elastic", **one, **{"elastic-tau": 1.0})  # ζ = τ = 1 where the output depends
    plain = short_run("fedavg", tmp_path / "fedavg", **one)
    assert elastic["train_loss"] == same_math(plain["train_loss"]) and elastic["client_loss"] == same_math(plain["client_loss"])
    assert_as_recorded("elastic", run)
