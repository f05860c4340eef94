"""A simulation on an existing Ray cluster (docs/ray-cluster.md): a head and a worker
node on loopback, each with one CPU, and the local SuperLink started with ``RAY_ADDRESS`` naming
the head. The virtual clients run on both nodes and the run gives the numbers of the in-process run
of the same seed; a worker node SIGKILLed mid-run leaves a run that goes on without it and ends."""

from __future__ import annotations

import threading
import time

import pytest
from local_runs import ONE_BY_ONE, LocalSimulation, check_results, numbers, results
from ray_cluster import RayCluster

from server_apps.inprocess import run_in_process

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600), pytest.mark.xdist_group("ray-cluster")]


@pytest.fixture(scope="module")
def cluster():
    nodes = RayCluster()
    try:
        nodes.start_head(cpus=1)
        nodes.start_worker("worker", cpus=1)
        yield nodes
    finally:
        assert not nodes.stop(), "a process of the test's Ray cluster is still running"


@pytest.fixture(scope="module")
def simulation(cluster, tmp_path_factory):
    sim = LocalSimulation(tmp_path_factory.mktemp("flwr_home"))
    sim.env["RAY_ADDRESS"] = cluster.address  # the SuperLink (and its simulation) joins the cluster
    yield sim
    assert not sim.stop(), "the test's SuperLink or one of its runs is still running"


def _reached(out_dir, server_round: int) -> bool:
    """Whether the run writing into ``out_dir`` has recorded ``server_round``'s training."""
    found = list(out_dir.glob("*/metrics.jsonl")) if out_dir.exists() else []
    return bool(found) and f'"round": {server_round}, "phase": "train"' in found[0].read_text()


def _watch_actors(cluster: RayCluster, seen: dict[str, set[int]], done: threading.Event) -> None:
    while not done.is_set():
        for node, pids in cluster.actors().items():
            seen.setdefault(node, set()).update(pids)
        time.sleep(0.2)


def test_a_run_across_two_nodes_gives_the_in_process_numbers_and_survives_a_lost_node(cluster, simulation, tmp_path):
    config = {"method": "fedmcsa", "num-rounds": 3, "clients-per-round": 3, "eval-every": 3, "seed": 2}
    seen: dict[str, set[int]] = {}
    done = threading.Event()
    watcher = threading.Thread(target=_watch_actors, args=(cluster, seen, done), daemon=True)
    watcher.start()
    try:
        run = simulation.run({**config, "output-dir": str(tmp_path / "cluster")}, nodes=6)
    finally:
        done.set()
        watcher.join()
    assert run["status"] == "finished:completed", run["status-details"] + run["log"][-3000:]
    assert set(seen) == {"head", "worker"}, f"virtual clients ran on {sorted(seen)} only"
    run_dir = results(tmp_path / "cluster")
    check_results(run_dir, "fedmcsa", rounds=3, nodes=6, per_round=3, evaluated=[1, 3])
    in_process = run_in_process({**config, **ONE_BY_ONE, "output-dir": str(tmp_path / "in-process")}, num_nodes=6)
    assert numbers(run_dir) == numbers(in_process)

    # the worker machine is lost two rounds into a longer run: its clients fail, the head's go on, the run ends
    proc = simulation.start({**config, "num-rounds": 12, "eval-every": 6, "local-steps": 60,
                             "output-dir": str(tmp_path / "lost")}, nodes=6)
    deadline = time.monotonic() + 240
    while not _reached(tmp_path / "lost", 2):
        assert time.monotonic() < deadline and proc.poll() is None, "the run did not reach its second round"
        time.sleep(0.5)
    cluster.kill("worker")
    proc.wait(timeout=240)  # nothing hangs
    (lost,) = [r for r in simulation.runs() if r["run-id"] != run["run-id"]]
    assert lost["status"] in ("finished:completed", "finished:failed"), lost
    rows = (results(tmp_path / "lost") / "metrics.jsonl").read_text()
    assert '"round": 12' in rows or "accepted no client update" in lost["status-details"], lost
