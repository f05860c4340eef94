"""A simulation on an existing Ray cluster (docs/ray-cluster.md): a head and a worker
node on loopback, each with one CPU, and the local SuperLink started with ``RAY_ADDRESS`` naming
the head. The virtual clients run on both nodes and the run gives the numbers of the in-process run
of the same seed. A worker node SIGKILLed mid-run: the run says so (it stops naming the loss, or ends
degraded), its console stays short, and it continues from its last checkpoint on the node left."""

from __future__ import annotations

import json
import subprocess
import threading
import time

import pytest
from local_runs import LocalSimulation, check_results, numbers, results
from ray_cluster import RayCluster

from server_apps.inprocess import run_in_process
from strategies.failures import RAY_ACTOR_LOSSES

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
    sim = LocalSimulation(tmp_path_factory.mktemp("flwr_home"), ray_address=cluster.address)  # its runs join the cluster
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
    config = {"method": "fedmcsa", "num-rounds": 3, "clients-per-round": 3, "eval-every": 3, "seed": 2, "num-clients": 12}
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
    check_results(run_dir, "fedmcsa", rounds=3, nodes=12, per_round=3, evaluated=[1, 3])  # 2 clients per node
    in_process = run_in_process({**config, "output-dir": str(tmp_path / "in-process")}, num_clients=12, num_nodes=6)
    assert numbers(run_dir) == numbers(in_process)

    # the worker machine is lost two rounds into a longer run: its actors' messages fail. The run never ends
    # "completed" on figures from too few clients: it stops naming the loss, or ends degraded; its console
    # output stays short (one line per node and cause; the tracebacks go to failures.log)
    longer = {**config, "num-rounds": 12, "eval-every": 3, "local-steps": 60, "checkpoint-every": 2, "lost-node-rounds": 1}
    stream = tmp_path / "lost.log"
    with stream.open("w") as sink:
        proc = simulation.start({**longer, "output-dir": str(tmp_path / "lost")}, nodes=6, stdout=sink, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 240
    while not _reached(tmp_path / "lost", 2):
        assert time.monotonic() < deadline and proc.poll() is None, "the run did not reach its second round"
        time.sleep(0.5)
    cluster.kill("worker")
    proc.wait(timeout=240)  # nothing hangs
    log = stream.read_text()
    folder = results(tmp_path / "lost")
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["client_failures"] > 0, log[-3000:]  # the dead worker's actors failed
    assert summary["status"] in ("failed", "degraded"), summary
    if summary["status"] == "failed":
        # the worker's actors are gone, not the virtual nodes: said so where every lost node failed by Ray's actor errors
        ray_only = all(lost["cause"] in RAY_ACTOR_LOSSES for lost in summary["lost_nodes"].values())
        said = "the Ray worker behind the actors of" if ray_only else "lost since round"
        assert said in summary["error"] and "resume-from" in summary["error"], summary
        assert "learning rate" not in summary["error"]
    else:
        assert summary["short_evaluated_rounds"] + summary["short_training_rounds"] > 0, summary
    assert any(cause.startswith(("Actor", "RayActorError")) for cause in summary["failures_by_cause"]), summary
    assert (folder / "failures.log").stat().st_size > 0
    assert log.count("Traceback") == 0 and len(log.splitlines()) < 300, f"{len(log.splitlines())} lines\n" + log[-3000:]
    print(f"\nworker lost after round 2: {summary['status']}, {summary['client_failures']} failures "
          f"({'; '.join(summary['failures_by_cause'])}), {len(log.splitlines())} console lines")

    # what a user can do: continue the run from its last checkpoint on the nodes left, once the head has declared
    # the lost one dead (Flower sizes a run's actor pool from the nodes Ray lists as alive)
    cluster.wait_until_declared_dead("worker")
    resumed = simulation.run({**longer, "output-dir": str(tmp_path / "lost"), "resume-from": str(folder)}, nodes=6)
    assert resumed["status"] == "finished:completed", resumed["status-details"] + resumed["log"][-3000:]
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert sorted({r["round"] for r in rows if r["phase"] == "train"}) == list(range(1, 13)), rows
    after = json.loads((folder / "summary.json").read_text())
    assert after["status"] in ("completed", "degraded"), after
    evaluated = {r["round"]: r["clients-evaluated"] for r in rows if r["phase"] == "evaluate"}
    assert evaluated[after["bmta_round"]] >= after["min_clients_evaluated"] > 0, (after, evaluated)  # never a short round
