"""Memory: one client's share of a batched round estimated by hand, a node's round trained in computations
that fit its budget, and a layout that cannot fit refused before its first round with the estimate and the
fix (``flower_pfl.engine.memory``, ``flower_pfl.experiment.footprint``)."""

from __future__ import annotations

import json

import pytest
import torch

import flower_pfl.experiment.footprint as footprint_module
from flower_pfl.engine.memory import activation_bytes, clients_per_computation, model_bytes, training_bytes
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.experiment.config import ConfigError, ExperimentConfig
from flower_pfl.experiment.footprint import DEPLOYMENT, IN_PROCESS, SIMULATION, check_fits, footprint
from flower_pfl.experiment.models import DNN
from flower_pfl.methods.fedmcsa import FedMCSA
from flower_pfl.methods.fedper import FedPer
from flower_pfl.methods.scaffold import SCAFFOLD
from server_apps.inprocess import run_in_process


def test_one_clients_training_by_hand():
    """A 60-20-10 DNN: 1,430 values (5,720 bytes); one sample's forward pass makes fc1's 20 values, the ReLU's 20
    and fc2's 10 (200 bytes)."""
    model = DNN(60, 10, hidden=20)
    assert model_bytes(model) == 4 * (60 * 20 + 20 + 20 * 10 + 10) == 5720
    assert activation_bytes(model, torch.zeros(60)) == 4 * (20 + 20 + 10)
    assert training_bytes(model, torch.zeros(60), batch_size=8, kept=100) == 6 * 5720 + 100 + 2 * 8 * 200
    assert clients_per_computation(1000, 10_500) == 10 and clients_per_computation(1000, 10) == 1
    assert clients_per_computation(1000, 10, asked=4) == 4


def _set_up(method, cfg: ExperimentConfig):
    from flower_pfl.experiment.build import initial_arrays

    server = MethodServer(method)
    server.initialize(initial_arrays(cfg))
    return server.method


def test_what_a_method_keeps_per_client_is_what_its_store_costs():
    """100 clients of the DNN: FedMCSA keeps every client's model on the server, FedPer its head (fc2: 210
    values), SCAFFOLD (one global model) none; SCAFFOLD's clients keep c_i beside their model."""
    cfg = ExperimentConfig(model="dnn", clients_per_round=10, batch_size=20)
    model = DNN(60, 10, hidden=20)
    mcsa = footprint(cfg, _set_up(FedMCSA(), cfg), model, 100, 10, IN_PROCESS)
    per = footprint(cfg, _set_up(FedPer(), cfg), model, 100, 10, IN_PROCESS)
    scaffold = footprint(cfg, _set_up(SCAFFOLD(), cfg), model, 100, 10, IN_PROCESS)
    assert (mcsa.store, per.store, scaffold.store) == (100 * 5720, 100 * 4 * 210, 0)
    assert footprint(ExperimentConfig(model="dnn", store="disk"), _set_up(FedMCSA(), cfg), model, 100, 10, IN_PROCESS).store == 0
    assert scaffold.node_round > footprint(cfg, None, model, 100, 10, IN_PROCESS).node_round  # FedAvg: no c_i
    assert (mcsa.nodes_at_once, footprint(cfg, None, model, 100, 10, DEPLOYMENT).nodes_at_once) == (1, 0)
    assert footprint(cfg, None, model, 100, 10, SIMULATION).nodes_at_once >= 1


def test_a_layout_that_cannot_fit_is_refused_with_the_estimate_and_the_fix():
    cfg = ExperimentConfig(model="dnn", clients_per_round=10)
    method = _set_up(FedMCSA(), cfg)
    found = check_fits(cfg, method, DNN(60, 10, hidden=20), 1000, 10, IN_PROCESS, free=1 << 40)
    with pytest.raises(ConfigError) as refused:
        check_fits(cfg, method, DNN(60, 10, hidden=20), 1000, 10, IN_PROCESS, free=found.total - 1)
    message = str(refused.value)
    assert message.startswith("this run would need about ") and "in process and the machine has" in message
    assert "the server's store of 1000 clients' models: 5.46 MiB" in message
    assert "store = 'disk'" in message and "fewer clients a node" in message


def test_a_run_that_cannot_fit_stops_before_its_first_round(tmp_path, monkeypatch):
    monkeypatch.setattr(footprint_module, "available_bytes", lambda: 2**16)  # a machine with 64 KiB free
    with pytest.raises(ConfigError, match="this run would need about .* and the machine has 64 KiB free"):
        run_in_process({"method": "fedmcsa", "num-rounds": 1, "output-dir": str(tmp_path)}, num_clients=40, num_nodes=4)
    assert not list(tmp_path.iterdir())  # no results folder: refused before anything was written


def test_a_nodes_round_trains_in_computations_that_fit_and_gives_the_numbers_of_one(tmp_path, monkeypatch):
    """Five clients of a round on one node, at most two a computation: three computations, the figures of one."""
    import client_apps.app as capp

    run = {"method": "scaffold", "num-rounds": 3, "clients-per-round": 5, "local-steps": 4, "eval-every": 1, "seed": 4}
    together, sizes = capp.train_together, []
    monkeypatch.setattr(capp, "train_together", lambda model, rounds: sizes.append(len(rounds)) or together(model, rounds))
    summaries = {}
    for name, chunk in (("whole", 0), ("chunked", 2)):
        sizes.clear()
        out = run_in_process({**run, "clients-per-computation": chunk, "output-dir": str(tmp_path / name)}, num_clients=10)
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        summaries[name] = [r["accuracy"] for r in rows if r["phase"] == "evaluate"]
        assert sizes == ([5] * 3 if name == "whole" else [2, 2, 1] * 3)
    assert summaries["chunked"] == pytest.approx(summaries["whole"], rel=1e-5)


def test_a_node_without_memory_for_one_clients_training_says_so(monkeypatch):
    from flwr.app import Context, RecordDict

    from client_apps.app import Node
    from flower_pfl.methods.scaffold import ScaffoldCorrection

    node = Node.from_context(Context(run_id=1, node_id=7, node_config={"partition-id": 0, "num-partitions": 2},
                                     state=RecordDict(), run_config=ExperimentConfig().to_run_config()))
    monkeypatch.setattr("client_apps.app.available_bytes", lambda device: 1000)
    with pytest.raises(MemoryError, match=r"one client's training needs about .* \(ScaffoldCorrection on this model, "
                                          r"batches of 20\), and this node's cpu has 1000 B free"):
        node.clients_per_computation(ScaffoldCorrection, {"batch-size": 20})
    node.node_config["clients-per-computation"] = 3  # the node's own setting wins, unchecked
    assert node.clients_per_computation(ScaffoldCorrection, {"batch-size": 20}) == 3
