"""FedBN: the batch-normalized models, BN tensors (affine weights and running statistics) through the
flat layout and both message paths, the server's averages by hand, the plain client, a short run."""

from __future__ import annotations

import fabricate as fb
import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict

from client_apps.app import train
from flower_pfl.engine.client_algorithm import ClientAlgorithm
from flower_pfl.engine.layout import ParamLayout, flatten_module, load_flat_
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.engine.model_facts import ModelFacts
from flower_pfl.engine.reply_checks import RawReply, UpdateRejected, check_update
from flower_pfl.experiment.config import ConfigError, ExperimentConfig
from flower_pfl.experiment.models import DNN, build_model
from flower_pfl.methods.fedbn import FedBN, norm_layers, norm_mask
from flower_pfl.methods.registry import client_algorithm_for

from .runs import assert_as_recorded, short_run

# --- the models -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name,shape,norms", [("dnn-bn", (60,), ["bn1"]), ("cnn-bn", (1, 28, 28), ["bn1", "bn2"])])
def test_bn_models_are_the_plain_ones_with_batch_norm(name, shape, norms):
    model = build_model(name, shape, 10, seed=0)
    plain = build_model(name.removesuffix("-bn"), shape, 10, seed=0)
    state = model.state_dict()
    assert sorted(norm_layers(ParamLayout.from_module(model))) == norms
    assert {k: v for k, v in state.items() if not k.startswith("bn")}.keys() == plain.state_dict().keys()
    for key, value in plain.state_dict().items():  # the same seeded weights: BN draws no random numbers
        assert torch.equal(state[key], value)
    assert model(torch.randn(4, *shape)).shape == (4, 10)
    assert list(state)[2].startswith("bn1.")  # right after the first layer: body/head splits stay in order


def test_the_int64_batch_counter_is_taken_as_float32_and_a_counter_past_float32_refused():
    """A reply's arrays are float32, or integers float32 holds exactly (a BN layer's ``num_batches_tracked``)."""
    stock = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    stock.train()
    stock(torch.randn(4, 3))
    layout = ParamLayout.from_module(stock)
    arrays = [t.numpy() for t in stock.state_dict().values()]
    assert arrays[-1].dtype == np.int64 and check_update(layout, arrays, list(layout.names))[-1] == 1.0
    arrays[-1] = np.array(2**25, dtype=np.int64)
    with pytest.raises(UpdateRejected, match="'1.num_batches_tracked' has dtype int64"):
        check_update(layout, arrays, list(layout.names))


def test_bn_buffers_survive_the_flat_layout():
    torch.manual_seed(0)
    model = build_model("dnn-bn", (5,), 3, hidden_units=4)
    model.train()
    model(torch.randn(16, 5) + 3.0)  # running statistics move, the counter counts
    vector = flatten_module(model)
    copy = build_model("dnn-bn", (5,), 3, hidden_units=4, seed=1)
    load_flat_(copy, vector)
    for (key, a), b in zip(model.state_dict().items(), copy.state_dict().values()):
        assert torch.equal(a, b), key
    assert copy.bn1.num_batches_tracked.item() == 1 and copy.bn1.running_mean.abs().sum() > 0


def test_bn_statistics_travel_through_a_message_api_round():
    """The package's ClientApp trains a dnn-bn; its reply passes the server's checks with the trained
    running statistics, and FedBN keeps them for that client only."""
    fb.set_task_identity()
    run_config = ExperimentConfig(model="dnn-bn").to_run_config()
    context = Context(run_id=1, node_id=3, node_config={"partition-id": 0, "num-partitions": 4}, state=RecordDict(), run_config=run_config)
    initial = {k: v.numpy() for k, v in build_model("dnn-bn", (60,), 10, seed=0).state_dict().items()}
    server = MethodServer(FedBN(), clients_per_round=1)
    server.initialize(initial)
    (ins,) = server.plan_training(1, [3])
    arrays = ArrayRecord({k: Array(v) for k, v in ParamLayout.from_arrays(initial).unflatten(ins.model.clone()).items()})
    config = ConfigRecord({"lr": 0.05, "local-steps": 3, "batch-size": 10, **ins.config})
    reply = train(Message(RecordDict({"arrays": arrays, "config": config}), message_type="train", dst_node_id=3), context)
    returned = {k: v.numpy() for k, v in reply.content["arrays"].items()}
    assert returned["bn1.num_batches_tracked"] == 3.0 and not np.allclose(returned["bn1.running_mean"], 0)
    checked = server.check(RawReply(3, list(returned.values()), list(returned), 100, {}))
    server.aggregate(1, [checked])
    kept = ParamLayout.from_arrays(initial).unflatten(server.plan_evaluation(2, [3, 4], 1.0)[0].model)
    for key, value in returned.items():  # one client: the shared mean is its model, and its BN is its own
        assert np.allclose(kept[key].numpy(), value), key
    other = ParamLayout.from_arrays(initial).unflatten(server.plan_evaluation(2, [3, 4], 1.0)[1].model)
    assert np.allclose(other["bn1.running_mean"].numpy(), 0) and np.allclose(other["fc1.weight"].numpy(), returned["fc1.weight"])


# --- the server, by hand --------------------------------------------------------------------------

SHAPES = {"fc1.weight": (2, 3), "fc1.bias": (2,), "bn1.weight": (2,), "bn1.bias": (2,), "bn1.running_mean": (2,),
          "bn1.running_var": (2,), "bn1.num_batches_tracked": (), "fc2.weight": (2, 2), "fc2.bias": (2,)}
SHARED, LOCAL = 6 + 2 + 4 + 2, 2 * 4 + 1  # fc1 + fc2; bn1


def _named(value: float) -> dict[str, np.ndarray]:
    return {k: np.full(s, value, dtype=np.float32) for k, s in SHAPES.items()}


def _reply(cid: int, value: float, n: int) -> RawReply:
    arrays = _named(value)
    return RawReply(cid, list(arrays.values()), list(arrays), n, {})


def _split(vector: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    mask = norm_mask(ParamLayout.from_arrays(_named(0.0)))
    return vector[~mask], vector[mask]


def test_norm_mask_marks_every_tensor_of_the_bn_layer():
    mask = norm_mask(ParamLayout.from_arrays(_named(0.0)))
    assert mask.tolist() == [False] * 8 + [True] * LOCAL + [False] * 6


@pytest.mark.parametrize("weighted, expected", [(False, (1.0 + 4.0) / 2), (True, 1.0 * 0.25 + 4.0 * 0.75)])
def test_shared_layers_are_averaged_and_bn_layers_stay_with_their_clients(weighted, expected):
    """Algorithm 1: w^(l) ← (1/K) Σ_k w_k^(l) for every non-BN layer (sample-weighted on request)."""
    server = MethodServer(FedBN(weighted=weighted), clients_per_round=2)
    server.initialize(_named(0.0))
    server.plan_training(1, [1, 2])
    server.aggregate(1, [server.check(_reply(1, 1.0, 10)), server.check(_reply(2, 4.0, 30))])
    for ins in server.plan_training(2, [1, 2]):
        shared, local = _split(ins.model)
        assert torch.allclose(shared, torch.full((SHARED,), expected))
        assert torch.all(local == {1: 1.0, 2: 4.0}[ins.client_id])
    sent = {ins.client_id: _split(ins.model) for ins in server.plan_evaluation(2, [1, 2, 3], 1.0)}
    assert torch.all(sent[3][1] == 0.0) and torch.allclose(sent[3][0], torch.full((SHARED,), expected))  # not yet trained: initial BN
    assert server.method.store.dim == LOCAL  # the store keeps each client's BN layers only


def test_a_model_without_bn_layers_is_refused_where_the_strategy_first_sees_it():
    server = MethodServer(FedBN(), clients_per_round=2)
    with pytest.raises(ValueError, match="FedBN cannot run on this model: it needs a model with batch normalization"):
        server.initialize({k: v.numpy() for k, v in DNN(3, 2, hidden=2).state_dict().items()})
    with pytest.raises(ValueError, match="no names: give the strategy its state_dict"):  # a legacy Parameters' positions
        server.initialize({str(i): v.numpy() for i, v in enumerate(DNN(3, 2, hidden=2, batch_norm=True).state_dict().values())})


def test_the_client_is_plain_local_sgd_and_the_hyperparameter_is_checked():
    server = MethodServer(FedBN(), clients_per_round=1)
    server.initialize(_named(0.0))
    assert client_algorithm_for(server.plan_training(1, [1])[0].config) is ClientAlgorithm
    with pytest.raises(ValueError, match="weighted"):
        ExperimentConfig(method="fedbn", options={"fedbn-weighted": "yes"})


# --- a whole run ----------------------------------------------------------------------------------

def test_short_run_as_recorded_and_local_bn_beats_fedavg_on_the_bn_model(short_runs, tmp_path):
    run = short_runs("fedbn")  # on dnn-bn: FedBN refuses the plain DNN
    fedavg = short_run("fedavg", tmp_path / "fedavg", model="dnn-bn")
    assert run["bmta"] > fedavg["bmta"] + 0.01
    assert_as_recorded("fedbn", run)


def test_a_model_without_batch_normalization_is_refused_before_the_run(tmp_path):
    with pytest.raises(ConfigError, match="'fedbn' cannot run on model 'dnn': it needs a model with batch normalization"):
        short_run("fedbn", tmp_path, model="dnn")
    assert not any(tmp_path.iterdir())  # nothing written
    assert FedBN.check_model(ModelFacts.of_model(build_model("resnet18", (3, 32, 32), 10, resnet_norm="group"))) is not None
    assert FedBN.check_model(ModelFacts.of_model(build_model("resnet18", (3, 32, 32), 10))) is None
