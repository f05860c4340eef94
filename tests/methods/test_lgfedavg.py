"""LG-FedAvg: the top layers averaged by samples and the lower layers kept per client, by hand with
fabricated replies; plain local SGD on the client; the refused settings; one whole run."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flower_pfl.engine.client_algorithm import ClientAlgorithm
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.engine.reply_checks import RawReply
from flower_pfl.experiment.config import ConfigError, ExperimentConfig
from flower_pfl.methods.lgfedavg import LGFedAvg
from flower_pfl.methods.registry import client_algorithm_for

from .runs import assert_as_recorded

#: a DNN-shaped model: fc1 (8 values, local), fc2 (6 values, global)
SHAPES = {"fc1.weight": (2, 3), "fc1.bias": (2,), "fc2.weight": (2, 2), "fc2.bias": (2,)}


def _named(low: float, top: float) -> dict[str, np.ndarray]:
    return {k: np.full(s, low if k.startswith("fc1") else top, dtype=np.float32) for k, s in SHAPES.items()}


def _server(**kwargs) -> MethodServer:
    server = MethodServer(LGFedAvg(**kwargs), clients_per_round=2)
    server.initialize(_named(0.0, 0.0))
    return server


def _reply(cid: int, low: float, top: float, n: int) -> RawReply:
    arrays = _named(low, top)
    return RawReply(cid, list(arrays.values()), list(arrays), n, {"num-examples": n})


def test_top_layers_are_the_sample_weighted_mean_and_lower_layers_stay_with_their_clients():
    server = _server()
    assert server.method.base_slice == slice(8, 14)  # the global part is fc2, the trailing columns
    plan = server.plan_training(1, [1, 2])
    assert all(client_algorithm_for(ins.config) is ClientAlgorithm for ins in plan)  # plain local SGD on the whole model
    server.aggregate(1, [server.check(_reply(1, 1.0, 10.0, 1)), server.check(_reply(2, 4.0, 20.0, 3))])
    torch.testing.assert_close(server.method.base, torch.full((6,), 10.0 * 0.25 + 20.0 * 0.75))  # θ^g = Σ |D_m|/|D| θ^g_m
    sent = {ins.client_id: ins.model for ins in server.plan_evaluation(1, [1, 2, 3], 1.0)}
    for cid, low in ((1, 1.0), (2, 4.0), (3, 0.0)):  # client 3 never trained: the initial lower layers
        assert torch.all(sent[cid][:8] == low) and torch.all(sent[cid][8:] == 17.5)


def test_the_next_round_sends_each_client_its_own_lower_layers_under_the_global_top():
    server = _server()
    server.plan_training(1, [1, 2])
    server.aggregate(1, [server.check(_reply(1, 1.0, 2.0, 1)), server.check(_reply(2, 3.0, 4.0, 1))])
    for ins in server.plan_training(2, [1, 2]):
        assert torch.all(ins.model[:8] == float(2 * ins.client_id - 1)) and torch.all(ins.model[8:] == 3.0)


def test_bad_hyperparameters_and_runs_are_refused():
    with pytest.raises(ValueError, match="head_layers = 0 is invalid"):
        LGFedAvg(head_layers=0)
    with pytest.raises(ValueError, match="leaves no body layer"):
        _server(head_layers=2)  # both layers global: that is FedAvg
    with pytest.raises(ConfigError, match="LG-FedAvg would be FedAvg"):
        ExperimentConfig(method="lgfedavg", model="mlr")


def test_short_run_as_recorded_and_local_representations_beat_fedavg(short_runs):
    lg = short_runs("lgfedavg")
    assert lg["bmta"] > short_runs("fedavg")["bmta"] + 0.2  # observed 0.762 vs 0.306
    assert_as_recorded("lgfedavg", lg)


def test_the_store_keeps_only_each_clients_lower_layers():
    arrays = {"fc1.weight": np.zeros((2, 3), np.float32), "fc1.bias": np.zeros(2, np.float32),
              "fc2.weight": np.zeros((2, 2), np.float32), "fc2.bias": np.zeros(2, np.float32)}
    server = MethodServer(LGFedAvg(), clients_per_round=1)
    server.initialize(arrays)
    assert server.method.own == slice(0, 8) and server.method.store.dim == 8  # fc1 local, fc2 global
