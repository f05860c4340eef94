"""Local training: the server only keeps each client's own model; nothing is shared. The server
step through both strategies, clients that train alone across rounds, and a short whole run."""

from __future__ import annotations

import math

import fabricate as fb
import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord
from flwr.common import parameters_to_ndarrays

import strategies
import strategies.message
from flower_pfl.engine.client_algorithm import CLIENT_ALGORITHM, ClientAlgorithm, TrainData, train_locally
from flower_pfl.engine.layout import ParamLayout
from flower_pfl.experiment.models import build_model
from flower_pfl.methods.local import Local
from flower_pfl.methods.registry import client_algorithm_for

from .runs import assert_as_recorded

NAMES, SHAPES = fb.NAMES, fb.SHAPES

_arrays, _flat, _sent = fb.model_arrays, fb.flat, fb.sent


@pytest.fixture(autouse=True)
def _identity():
    fb.set_task_identity()


def test_the_server_algorithm_returns_the_stored_models_unchanged():
    models = torch.randn(4, 8)
    out, weights = Local().personalize(models, ParamLayout(names=("w",), shapes=((8,),)))
    assert torch.equal(out, models) and weights is None
    assert Local().train_config(1) == Local().evaluation_config() == {} and Local().client_algorithm() is ClientAlgorithm
    assert client_algorithm_for(Local().train_config(1)) is ClientAlgorithm


def test_each_client_gets_its_own_model_and_no_proximal_term():
    grid = fb.FakeGrid(range(6))
    # fabricated jumps (a model of 3 comes back as 33) are beyond the update bound: off here
    strat = strategies.message.Local(clients_per_round=3, min_available_nodes=1, seed=1, max_update_ratio=math.inf)
    start = ArrayRecord({n: fb.Array(a) for n, a in _arrays(0.0).items()})
    trained: dict[int, int] = {}
    for rnd in (1, 2, 3):
        msgs = list(strat.configure_train(rnd, start, ConfigRecord({"lr": 0.1}), grid))
        for msg in msgs:
            node = msg.metadata.dst_node_id
            # its own last model, or the initial one before it first trained
            want = _arrays(10.0 * trained[node] + node) if node in trained else _arrays(0.0)
            assert torch.equal(_sent(msg), _flat(want))
            assert msg.content["config"][CLIENT_ALGORITHM] == "sgd"
        arrays, metrics = strat.aggregate_train(rnd, [fb.train_reply(m, _arrays(10.0 * rnd + m.metadata.dst_node_id))
                                                      for m in msgs])
        assert arrays is None and metrics["clients-accepted"] == 3
        trained.update({m.metadata.dst_node_id: rnd for m in msgs})
    assert len(strat.method.attention_weights) == 0  # no weights: nothing is mixed
    for msg in strat.configure_evaluate(3, start, ConfigRecord(), grid):
        node = msg.metadata.dst_node_id
        assert torch.equal(_sent(msg), _flat(_arrays(10.0 * trained[node] + node) if node in trained else _arrays(0.0)))


def test_legacy_sends_each_client_its_own_model():
    cm = fb.client_manager([str(i) for i in range(4)])
    strat = strategies.Local(initial_parameters=_arrays(0.0), clients_per_round=4, min_available_clients=1)
    ins = strat.configure_fit(1, strat.initial_parameters, cm)
    params, _ = strat.aggregate_fit(1, [(p, fb.fit_res(list(_arrays(1.0 + int(p.cid)).values()))) for p, _ in ins], [])
    assert params is None
    for proxy, fitins in strat.configure_fit(2, strat.initial_parameters, cm):
        assert torch.equal(_flat(parameters_to_ndarrays(fitins.parameters)), _flat(_arrays(1.0 + int(proxy.cid))))
        assert fitins.config[CLIENT_ALGORITHM] == "sgd"
    for proxy, evalins in strat.configure_evaluate(2, strat.initial_parameters, cm):
        assert torch.equal(_flat(parameters_to_ndarrays(evalins.parameters)), _flat(_arrays(1.0 + int(proxy.cid))))


def test_rounds_of_local_training_are_one_long_local_training():
    """Three clients, all training every round: after three rounds each client's model is what
    three rounds of local SGD on its own data alone give, whatever the others did."""
    lr, steps, batch = 0.1, 3, 8
    start = build_model("dnn", (6,), 3, hidden_units=5, seed=1).state_dict()
    data = {}
    for node in range(3):
        g = torch.Generator().manual_seed(node)
        x = torch.randn(24, 6, generator=g)
        data[node] = TrainData(x, (x[:, node] > 0).long())  # a different task per client

    def train(arrays, config, node, rnd):
        model = build_model("dnn", (6,), 3, hidden_units=5, seed=1)
        model.load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in arrays.items()})
        train_locally(client_algorithm_for(config)(model, config), model, data[node], steps=steps, lr=lr, batch_size=batch,
                      generator=torch.Generator().manual_seed(10 * node + rnd))
        return {k: v.detach().numpy() for k, v in model.state_dict().items()}

    grid = fb.FakeGrid(range(3))
    strat = strategies.message.Local(clients_per_round=3, min_available_nodes=1)
    config = {"lr": lr, "local-steps": steps, "batch-size": batch}
    for rnd in (1, 2, 3):
        msgs = list(strat.configure_train(rnd, ArrayRecord({k: fb.Array(v.numpy()) for k, v in start.items()}),
                                          ConfigRecord(config), grid))
        strat.aggregate_train(rnd, [fb.train_reply(m, train({k: v.numpy() for k, v in m.content["arrays"].items()},
                                                            dict(m.content["config"]), m.metadata.dst_node_id, rnd))
                                    for m in msgs])
    finals = []
    for node in range(3):
        alone = {k: v.numpy() for k, v in start.items()}
        for rnd in (1, 2, 3):
            alone = train(alone, config, node, rnd)
        assert torch.allclose(strat.method.store.get([node])[0], _flat(alone), atol=1e-6)
        finals.append(_flat(alone))
    assert not torch.allclose(finals[0], finals[1], atol=1e-3)  # the clients really differ


def test_short_run_as_recorded_and_better_than_fedavg(short_runs):
    """On Synthetic(0.5, 0.5) every client has its own task: local models beat one FedAvg model."""
    summary = short_runs("local")
    assert_as_recorded("local", summary)
    assert summary["bmta"] > short_runs("fedavg")["bmta"] + 0.05
