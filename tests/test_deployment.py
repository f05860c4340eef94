"""Deployment: the app against a real SuperLink and SuperNodes (separate processes on 127.0.0.1),
plain, with TLS, and with SuperNode authentication."""

from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest
from deployment import LocalDeployment, _alive, _descendants
from local_runs import kill_after_checkpoint, numbers

from client_apps.flower_internals import HEARTBEAT_PATIENCE
from flower_pfl.engine.wire import fingerprint
from flower_pfl.run import tensor_files
from flower_pfl.run.results import CHECKPOINT, MODELS, load_models
from flower_pfl.tools import superlink
from flower_pfl.tools.credentials import write_node_key
from flower_pfl.tools.sweep_flwr import run_config_text
from server_apps.inprocess import run_in_process

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def _each_node_evaluated_its_own_model(run_dir, server_round: int) -> None:
    """Each node that evaluated in ``server_round`` (the last) evaluated the personalized model stored for it,
    nobody else's, and the personalized models differ."""
    ids, rows, _ = load_models(run_dir / MODELS)
    stored = {int(i): fingerprint([row]) for i, row in zip(ids, rows)}
    evaluated = {r["node-id"]: r["model-fingerprint"] for r in map(json.loads, (run_dir / "clients.jsonl").read_text().splitlines())
                 if r["round"] == server_round}
    assert len(evaluated) >= 2 and evaluated == {node: stored[node] for node in evaluated}, (evaluated, stored)
    assert len(set(evaluated.values())) == len(evaluated)


def test_killed_serverapp_resumes_on_the_same_supernodes_over_tls_with_authentication(tmp_path):
    """A deployment with TLS and SuperNode authentication (the other runs without either): SIGKILL the ServerApp
    process after its first checkpoint, resume from the results folder on the same SuperLink and SuperNodes
    (whose clients get their SCAFFOLD c_i back from their own disk), and compare with the uninterrupted run
    (in-process: test_e2e_flwr_run.py shows it gives the numbers of an uninterrupted ``flwr run``). Each SuperNode
    hosts three clients (its node config's ``partition-ids``) and trains them as one computation. Then a
    SuperNode whose key was never registered is turned away while the run's nodes stay online."""
    settings = {"method": "scaffold", "num-rounds": 2, "clients-per-round": 2, "eval-every": 1, "checkpoint-every": 1, "seed": 2}
    killed = tmp_path / "killed"
    with LocalDeployment(tmp_path / "deployment", nodes=2, tls=True, auth=True, clients_per_node=3) as deployment:
        stream = deployment.start_run(run_config_text({**settings, "output-dir": str(killed)}))
        folder = kill_after_checkpoint(stream.proc, killed, 1, lambda: [pid for p in deployment.procs for pid in _descendants(p.pid)
                                                                        if "flwr-serverapp" in " ".join(superlink.cmdline(pid))],
                                       lambda: stream.phases() + "\n" + deployment.log_tail())
        assert tensor_files.read(folder / CHECKPOINT)[1]["round"] < 2
        resumed = deployment.run(run_config_text({**settings, "resume-from": str(folder), "output-dir": str(killed)}))
        key, _ = write_node_key(tmp_path / "stranger")
        stranger = deployment.start_supernode("stranger", 0, key, retries=2)
        assert stranger.wait(timeout=120) != 0
        assert "Failed to activate SuperNode" in (tmp_path / "deployment" / "stranger.log").read_text()
        assert sum(n["status"] == "online" for n in deployment.supernodes()) == 2
    assert not deployment.left_running, "processes of the deployment are still running"
    assert resumed["status"] == "finished:completed", resumed["status-details"] + resumed["log"][-3000:]
    whole = run_in_process({**settings, "output-dir": str(tmp_path / "whole")}, num_clients=6, num_nodes=2)
    assert numbers(folder) == numbers(whole)
    assert [r["round"] for r in numbers(folder)[0] if r["phase"] == "evaluate"] == [1, 2]


def test_a_lost_supernode_delays_a_round_at_most_node_wait_timeout(tmp_path):
    """Deployment: SIGKILL one of three SuperNodes (and its ClientApps) after round 1 of a run that
    wants all three every round. The run goes on with the two left: the round the lost node was
    in answers once the SuperLink declares it offline (Flower's heartbeat patience), one wait for
    the third node ends after ``node-wait-timeout`` and later rounds do not wait for it again; the
    log names the lost node by its id, once as lost, and the summary lists it with Flower's error. With
    ``min-evaluated-share = 0.5`` the two left still make rounds that count, each evaluating the FedMCSA model
    personalized for it. The SuperNodes declare Flower's shortest heartbeat interval,
    10 s, so the SuperLink notices the loss after 20 s instead of 60."""
    timeout, rounds, victim, interval = 10, 4, 2, 10.0  # victim: the partition whose SuperNode is lost
    out = tmp_path / "results"
    # evaluated in rounds 1 and 4 only: every message of a deployment starts a ClientApp process (seconds of CPU)
    settings = (f"method='fedmcsa' num-rounds={rounds} clients-per-round=3 eval-every={rounds} node-wait-timeout={timeout} "
                f"min-evaluated-share=0.5 output-dir='{out}'")

    def rows(name):
        found = list(out.glob(f"*/{name}"))
        return [json.loads(line) for line in found[0].read_text().splitlines() if line.strip()] if found else []

    with LocalDeployment(tmp_path / "deployment", nodes=3, heartbeat=interval) as deployment:
        started = time.monotonic()
        stream = deployment.start_run(settings)
        try:
            # round 1 trained and every node evaluated (its row names node id and partition)
            deadline, first = time.time() + 300, []
            while time.time() < deadline and stream.proc.poll() is None:
                first = [r for r in rows("clients.jsonl") if r["round"] == 1]
                if any(r["phase"] == "train" and r["round"] == 1 for r in rows("metrics.jsonl")) and len(first) == 3:
                    break
                time.sleep(0.2)
            assert len(first) == 3, "round 1 did not finish on three nodes: " + stream.phases() + deployment.log_tail()
            lost = {r["partition-id"]: r["node-id"] for r in first}[victim]
            (node,) = [p for p in deployment.procs if f"partition-id={victim} " in " ".join(map(str, p.args))]
            family = _descendants(node.pid)
            node.kill()
            for pid in family:  # its ClientApp processes, if any are running
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            killed = time.monotonic()
            node.wait(timeout=30)
            gone = time.time() + 30
            while any(_alive(pid) for pid in family) and time.time() < gone:
                time.sleep(0.1)
            assert not [pid for pid in family if _alive(pid)], "the lost SuperNode's processes still run"
            before_kill = killed - started  # start-up and one round on three nodes
            run = deployment.finish(stream, timeout=300)
            finished = time.monotonic()
        finally:
            if stream.proc.poll() is None:
                stream.proc.kill()
                stream.proc.wait()
    assert not deployment.left_running, "processes of the deployment are still running"
    log = run["log"]
    assert run["status"] == "finished:completed", run["status-details"] + log[-3000:]

    metrics = rows("metrics.jsonl")
    train = {r["round"]: r for r in metrics if r["phase"] == "train"}
    assert sorted(train) == list(range(1, rounds + 1)), metrics
    assert train[1]["clients-accepted"] == 3
    assert all(train[r]["clients-accepted"] + train[r]["clients-failed"] <= 3 for r in train)
    assert all(train[r]["clients-accepted"] >= 2 for r in train)  # the survivors always trained
    assert any(train[r]["clients-accepted"] == 2 for r in range(2, rounds + 1)), train
    assert train[rounds]["clients-accepted"] == 2  # the last round ran with the two left
    last = [r for r in rows("clients.jsonl") if r["round"] == rounds]
    assert sorted(r["partition-id"] for r in last) == sorted({0, 1, 2} - {victim})
    assert lost not in {r["node-id"] for r in last}
    _each_node_evaluated_its_own_model(next(out.iterdir()), rounds)

    # the lost node is named by its own id, never as node 1 (the SuperLink's id in the errors it makes)
    assert not re.search(r"\bnode 1\b|nodes \[1\]|\[1\]\)", log), log[-3000:]
    named = [line for line in log.splitlines() if str(lost) in line and ("failed" in line or "no reply" in line or "missing" in line)]
    assert named, f"the log never names the lost node {lost}\n" + log[-3000:]
    declared = [line for line in log.splitlines() if " lost: " in line]
    assert len(declared) == 1 and str(lost) in declared[0], log[-3000:]
    (summary,) = [json.loads(p.read_text()) for p in out.glob("*/summary.json")]
    assert summary["status"] == "completed" and list(summary["lost_nodes"]) == [str(lost)], summary
    assert summary["lost_nodes"][str(lost)]["cause"] in ("Node Unavailable", "disconnected"), summary
    waits = [line for line in log.splitlines() if "going on with them after" in line]
    # one bounded wait for the lost node, then later rounds go on with the two without waiting again
    assert len(waits) == 1 and f"missing since an earlier round: [{lost}]" in waits[0], log[-3000:]

    # bounded delay: the round in flight waits for the SuperLink to declare the node offline, then
    # one wait of node-wait-timeout; the rounds left take about as long as round 1
    after_kill = finished - killed
    heartbeat = HEARTBEAT_PATIENCE * interval
    bound = heartbeat + timeout + (rounds - 1) * before_kill
    print(f"\nlost node {lost} (partition {victim}); start-up + round 1: {before_kill:.0f} s; "
          f"kill -> run finished: {after_kill:.0f} s (bound {bound:.0f} s); {len(waits)} bounded waits; "
          f"train rows: {[(r, train[r]['clients-accepted'], train[r]['clients-failed']) for r in sorted(train)]}")
    assert after_kill < bound, (after_kill, bound)
