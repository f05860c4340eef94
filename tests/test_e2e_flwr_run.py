"""End to end through ``flwr run``: a private local SuperLink, Ray-backed virtual clients.

Each ``flwr run`` costs process start-ups (about 15 s), so each run here checks every guarantee it
can: a run that finishes is compared, to the last bit, with the in-process run of the same config
(``server_apps.inprocess``: the same ServerApp and ClientApp without Ray), which proves both that
the same seed gives the same numbers under ``flwr run`` and that nothing is lost on the way through
Ray. Tests are grouped (``xdist_group``) so that each group's runs share one SuperLink and one Ray.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import torch
from local_runs import ROOT, LocalSimulation, check_results, kill_after_checkpoint, numbers, results
from ray_cluster import RayCluster
from test_trackers import assert_series_match, expected_series, mlflow_run, mlflow_series, tensorboard_events

from flower_pfl.engine.disk_store import DiskClientModelStore
from flower_pfl.engine.wire import fingerprint
from flower_pfl.run import tensor_files
from flower_pfl.run.cost import COST_KEYS
from flower_pfl.run.results import CHECKPOINT, MODELS, load_models
from server_apps.inprocess import run_in_process

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def simulation(tmp_path_factory):
    """A SuperLink and a Ray of one CPU, shared by a test process's runs: each run's simulation joins that Ray
    instead of starting and stopping one of its own (seconds of every run), and one virtual-client actor serves
    its nodes (each actor imports PyTorch and the app; the numbers do not depend on how many there are). The
    actors are each run's own."""
    cluster = RayCluster()
    try:
        cluster.start_head(cpus=1)
        sim = LocalSimulation(tmp_path_factory.mktemp("flwr_home"), ray_address=cluster.address)
        yield sim
        assert not sim.stop(), "the test's SuperLink or one of its runs is still running"
    finally:
        assert not cluster.stop(), "a process of the test's Ray cluster is still running"


@pytest.fixture
def simulation_with_its_own_ray(tmp_path):
    """A SuperLink whose runs start a Ray of their own, as a user's ``flwr run`` does."""
    sim = LocalSimulation(tmp_path / "flwr_home")
    yield sim
    assert not sim.stop(), "the test's SuperLink or one of its runs is still running"


def _completed(run: dict) -> None:
    assert run["status"] == "finished:completed", run["status-details"] + run["log"][-3000:]


def _stored(run_dir: Path) -> dict[int, torch.Tensor]:
    """Every node's personalized model as the run left it, by node id: from the results' models file, or
    the disk store in the results folder (``store = "disk"``)."""
    if (run_dir / MODELS).exists():
        ids, rows, _ = load_models(run_dir / MODELS)
    else:
        store = DiskClientModelStore.open(run_dir / "store")
        ids, rows = store.ids(), store.get(store.ids())
    return {int(i): row for i, row in zip(ids, rows)}


def _by_partition(run_dir: Path, models: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
    partition = {r["node-id"]: r["partition-id"] for r in map(json.loads, (run_dir / "clients.jsonl").read_text().splitlines())}
    return {partition[node]: row for node, row in models.items()}


def _own_models_evaluated(run_dir: Path, last_round: int) -> None:
    """Each node evaluated the personalized model stored for it, nobody else's."""
    stored = {node: fingerprint([row]) for node, row in _stored(run_dir).items()}
    clients = [json.loads(line) for line in (run_dir / "clients.jsonl").read_text().splitlines()]
    assert {r["node-id"]: r["model-fingerprint"] for r in clients if r["round"] == last_round} == stored


# --- same seed, same numbers ---------------------------------------------------------------------

@pytest.mark.xdist_group("flwr-run-a")
def test_flwr_run_gives_the_in_process_numbers_of_the_same_seed(simulation_with_its_own_ray, tmp_path, monkeypatch):
    """Flower's own FedAvg in examples/own_data_app, whose data and model by import path load in every process
    ``flwr run`` starts (the app's folder is on their path), on a Ray of the run's own, as a user's: a ``flwr
    run`` gives, to the last bit, the numbers of the in-process run with the same seed, although Flower's
    runtime threads draw from Python's global ``random`` and node ids differ; the run writes every result file.
    (The package's strategies, through both APIs, are held to the same in the resume tests below: their killed
    and resumed runs give the in-process numbers of a run never interrupted, the rounds before the kill too.)"""
    method, api, simulation = "fedavg", "message", simulation_with_its_own_ray
    config = {"method": method, "num-rounds": 3, "clients-per-round": 3, "eval-every": 1, "seed": 3, "num-clients": 6}
    app = ROOT / "examples" / "own_data_app"  # the app lists only the keys it sets (api is the default, message)
    run = simulation.run({**config, "output-dir": str(tmp_path / "flwr")}, nodes=2, app=app)  # 3 clients per node
    _completed(run)
    run_dir = results(tmp_path / "flwr")
    check_results(run_dir, method, rounds=3, nodes=6, per_round=3, evaluated=[1, 2, 3])
    summary = json.loads((run_dir / "summary.json").read_text())
    # the nodes say how they ran their clients (this app's convolutional model: one by one on the CPU)
    assert summary["clients_trained_together"] + summary["clients_trained_one_by_one"] == 9
    assert summary["clients_evaluated_together"] + summary["clients_evaluated_one_by_one"] == 18
    # the app's own keys (its data, model, partition and training) beside the overrides
    monkeypatch.syspath_prepend(str(app))
    config = {**tomllib.loads((app / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"], **config, "api": api}
    assert summary["client_groups"]["5"] == "machine5"
    in_process = run_in_process({**config, "output-dir": str(tmp_path / "in-process")}, num_clients=6, num_nodes=2)
    assert numbers(run_dir) == numbers(in_process)
    assert not (run_dir / MODELS).exists()  # a global-model method keeps no personalized models


# --- a killed server resumes ---------------------------------------------------------------------

@pytest.mark.parametrize("method", [pytest.param("fedmcsa", marks=pytest.mark.xdist_group("flwr-run-c")),
                                    pytest.param("scaffold", marks=pytest.mark.xdist_group("flwr-run-e"))])
def test_server_killed_mid_run_resumes_to_the_uninterrupted_numbers(simulation, tmp_path, method):
    """A personalized method through the legacy API (whose server gathers results on threads) with its models in
    the disk store (rolled back to the checkpoint), and through the Message API a method with state on both
    sides (SCAFFOLD's server control variate in the checkpoint, the clients' c_i restored from the nodes'
    disks), on nodes that host three clients each, with a validation part and a client that never trains, and live
    trackers: SIGKILL the ServerApp's process after its first checkpoint, resume from the
    results folder, and compare every number, those of the rounds before the kill too, with the in-process run
    of the same seed that was never interrupted. (Every method's resume is compared in-process, by
    ``tests/test_checkpoint.py``: what the server's checkpoint holds is the same whatever runs it.)"""
    settings = {"method": method, "num-rounds": 8, "clients-per-round": 3, "eval-every": 2, "checkpoint-every": 2, "seed": 4,
                **({"store": "disk", "api": "legacy"} if method == "fedmcsa" else {}),
                **({"tracker": "tensorboard,mlflow", "num-clients": 6, "val-fraction": 0.2, "unseen-fraction": 0.2,
                    "new-client-finetune-steps": 2} if method == "scaffold" else {})}
    nodes = 6 if method == "fedmcsa" else 2  # the legacy API's nodes are one client each; SCAFFOLD's host 3 clients each
    killed = tmp_path / "killed"
    proc = simulation.start({**settings, "output-dir": str(killed)}, nodes=nodes, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    folder = kill_after_checkpoint(proc, killed, 2, simulation.server_processes)
    assert tensor_files.read(folder / CHECKPOINT)[1]["round"] < 8, "the run finished before it was killed"

    _completed(simulation.run({**settings, "resume-from": str(folder), "output-dir": str(killed)}, nodes=nodes))
    whole = run_in_process({**settings, "tracker": "", "output-dir": str(tmp_path / "whole")}, num_clients=6, num_nodes=nodes)
    assert numbers(folder) == numbers(whole)
    check_results(folder, method, rounds=8, nodes=6, per_round=3, evaluated=[1, 2, 4, 6, 8])
    if method == "fedmcsa":
        _own_models_evaluated(folder, last_round=8)
        resumed, uninterrupted = _by_partition(folder, _stored(folder)), _by_partition(whole, _stored(whole))
        assert resumed.keys() == uninterrupted.keys() and all(torch.equal(resumed[p], uninterrupted[p]) for p in resumed)
    if method == "scaffold":
        # its nodes trained their clients as one computation, to the same bits as in process; one client never trained
        summary = json.loads((folder / "summary.json").read_text())
        assert summary["clients_trained_together"] > 0 and summary["unseen_clients"] == 1 and "val_selected_accuracy" in summary
        # the trackers went on in the same runs: every round once, as metrics.jsonl has it (but the cost: the
        # rounds the killed process logged after its checkpoint were measured again, and their instructions differ)
        expected = expected_series(folder, leave_out=COST_KEYS)
        assert_series_match(tensorboard_events(folder / "tensorboard")["scalars"], expected, float32=True)
        client, run = mlflow_run(folder)
        assert_series_match(mlflow_series(client, run), expected)
        assert run.info.status == "FINISHED" and len(client.search_runs([run.info.experiment_id])) == 1


# --- runs that must fail, and say why ------------------------------------------------------------

@pytest.mark.xdist_group("flwr-run-a")
def test_bad_run_config_stops_the_run_with_a_clear_message(simulation, tmp_path):
    """Given under its earlier name (``sigma``), a method key still reaches the run, whose error names it as it is now."""
    run = simulation.run({"sigma": -1.0, "output-dir": str(tmp_path)}, nodes=2)
    assert run["status"] == "finished:failed"
    assert "'fedmcsa-sigma'" in run["status-details"] and "> 0" in run["status-details"]
    assert not list(tmp_path.iterdir())  # nothing half-written


@pytest.mark.xdist_group("flwr-run-a")
def test_a_run_no_node_can_serve_is_one_message_and_its_tracebacks_go_to_a_file(simulation, tmp_path):
    """A data set none of the nodes has: one message naming the key and the fix, no traceback on the
    console; the nodes' tracebacks are kept in a file the console names, and no results folder is made."""
    run = simulation.run({"dataset": "fmnist", "partition": "iid", "model": "cnn", "data-dir": str(tmp_path / "no-data"),
                          "output-dir": str(tmp_path / "results")}, nodes=3)
    assert run["status"] == "finished:failed", run["status"]
    log = run["log"]
    assert log.count("no node could serve this run config") >= 1 and "set 'data-dir' or 'download = true'" in log, log[-3000:]
    assert "Traceback" not in log and len(log.splitlines()) < 40, f"{len(log.splitlines())} lines\n" + log[-3000:]
    kept = re.search(r"error records \(tracebacks\) are in (\S+)", log)
    assert kept, log[-3000:]
    assert Path(kept.group(1)).read_text().count("Traceback") >= 3  # one per node at least
    Path(kept.group(1)).unlink()
    assert not (tmp_path / "results").exists()


@pytest.mark.xdist_group("flwr-run-c")
def test_a_run_that_accepts_no_update_ends_failed_and_says_why(simulation, tmp_path):
    """lr = 1e30: every update is refused by the update bound; the run must not report success."""
    run = simulation.run({"method": "fedmcsa", "lr": 1e30, "num-rounds": 4, "clients-per-round": 2, "eval-every": 4,
                          "output-dir": str(tmp_path)}, nodes=2)
    assert run["status"] == "finished:failed", run["status"]
    assert "accepted no client update" in run["status-details"] + run["log"]
    assert "rejected (" in run["log"]  # each refusal is logged with its reason
    summary = json.loads((results(tmp_path) / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["idle_rounds"] == 3


# --- many clients --------------------------------------------------------------------------------

@pytest.mark.xdist_group("flwr-run-f")
def test_many_clients_partial_participation(simulation, tmp_path):
    """The README's federation: 100 clients on 2 nodes, 20 sampled a round and trained by their nodes as one
    computation, every client evaluated."""
    run = simulation.run({"method": "fedacs", "train-samples-per-client": 50, "num-rounds": 2, "clients-per-round": 20,
                          "num-clients": 100, "eval-every": 2, "output-dir": str(tmp_path)}, nodes=2)
    _completed(run)
    assert "100 clients on 2 nodes" in run["log"], run["log"][-3000:]
    rows = [json.loads(line) for line in (results(tmp_path) / "metrics.jsonl").read_text().splitlines()]
    assert [r["clients-accepted"] for r in rows if r["phase"] == "train"] == [20, 20]
    assert [r["clients-evaluated"] for r in rows if r["phase"] == "evaluate"] == [100, 100]  # rounds 1 and 2
    summary = json.loads((results(tmp_path) / "summary.json").read_text())
    assert summary["clients_trained_together"] == 40 and summary["clients_evaluated_together"] == 200


# --- users' own apps -----------------------------------------------------------------------------

def _accuracies(log: str, pattern: str) -> list[float]:
    return [float(a) for a in re.findall(pattern, log)]


@pytest.mark.xdist_group("flwr-run-d")
def test_own_legacy_app_with_fedacs_swapped_in(simulation):
    """examples/legacy_app: a NumPyClient with plain SGD; the ServerApp's FedAvg replaced by FedACS."""
    run = simulation.run({"num-rounds": 3}, nodes=6, app=ROOT / "examples" / "legacy_app")
    _completed(run)
    assert "History (metrics, distributed, evaluate)" in run["log"], run["log"][-3000:]
    assert "'accuracy'" in run["log"] and "'clients-accepted'" in run["log"]


@pytest.mark.xdist_group("flwr-run-e")
def test_plain_app_names_its_strategy_and_metric(simulation, tmp_path):
    """examples/plain_app without its query function, under ``flwr run`` (20 nodes, 5 rounds): a plain client
    reporting ``eval-acc``; the ServerApp builds FedMCSA from its import path with ``accuracy_key="eval-acc"``.
    The guest sends the app no query it did not offer; it says once how it ranks nodes, and once that the
    client ignores FedMCSA's proximal term; the run completes with the app's metric names, and its console
    stays short (Flower's own FedAvg prints 104 lines for this run) and free of tracebacks."""
    app = tmp_path / "plain_app"
    shutil.copytree(ROOT / "examples" / "plain_app", app)
    client = app / "plain_app" / "client_app.py"
    source = client.read_text()
    client.write_text(source[:source.index("@app.query()")])  # an app that answers no query
    config = {"strategy": "strategies.message.FedMCSA", "strategy-args": '{"accuracy_key": "eval-acc"}', "num-rounds": 5}
    run = simulation.run(config, nodes=20, app=app)
    _completed(run)
    log = run["log"]
    accuracies = _accuracies(log, r"plain-app: round \d+ eval-acc ([0-9.]+)")
    assert len(accuracies) == 5 and all(0 <= a <= 1 for a in accuracies), log[-3000:]
    assert "'eval-acc-mean'" in log and "'eval-acc-bmta'" in log, log[-3000:]
    assert log.count("receipt 'client-algorithm' = 'proximal'") == 1, log[-3000:]
    assert "Traceback" not in log and "No query function" not in log and len(log.splitlines()) < 100, log
    (ranks,) = [line for line in log.splitlines() if "not reported 'partition-id'" in line]
    assert "20 of 20 nodes have not reported" in ranks and "rank_query=True" in ranks
    assert log.count("configure_train: 10 nodes train") == 5  # the strategy's per-round progress
    finals = [line for line in log.splitlines() if re.search(r"\tround \d (train|evaluate): ", line)]
    assert len(finals) == 10 and all("eval-acc-mean" in line for line in finals if "evaluate" in line), log


@pytest.mark.xdist_group("flwr-run-f")
def test_own_message_app_with_scaffolds_client_algorithm(simulation):
    """examples/message_app: the user's own loop with SCAFFOLD's ``algorithm_for`` hooks, whose Δc_i travels
    back in the reply through Ray (every method of the app runs in-process in test_example_apps.py)."""
    run = simulation.run({"method": "scaffold", "num-rounds": 3, "clients-per-round": 6}, nodes=6,
                         app=ROOT / "examples" / "message_app")
    _completed(run)
    accuracies = _accuracies(run["log"], r"message-app: round \d+ accuracy ([0-9.]+)")
    assert len(accuracies) == 3, run["log"][-3000:]
    # every update, and every control-variate delta, was accepted
    assert "'clients-accepted': 6" in run["log"] and "'clients-rejected': 0" in run["log"] and "rejected (" not in run["log"]
