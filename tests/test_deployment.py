"""Deployment: the app against a real SuperLink and SuperNodes (separate processes on 127.0.0.1),
plain, with TLS, and with SuperNode authentication."""

from __future__ import annotations

import json

import pytest

from deployment import LocalDeployment
from flower_pfl.credentials import write_node_key
from flower_pfl.results import MODELS, load_models
from flower_pfl.wire import fingerprint

pytestmark = pytest.mark.e2e


def _check_fedmcsa_run(run: dict, out) -> None:
    """Finished; two rounds of metrics; each node evaluated the personalized model stored for it."""
    assert run["status"] == "finished:completed", run["status-details"] + run["log"][-3000:]
    (run_dir,) = list(out.iterdir())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows if r["phase"] == "train"] == [1, 2]
    assert all(r["clients-accepted"] == 2 for r in rows if r["phase"] == "train")
    assert [r["round"] for r in rows if r["phase"] == "evaluate"] == [1, 2]
    store = dict(zip(("ids", "rows", "initial"), load_models(run_dir / MODELS)))
    stored = {int(i): fingerprint([row]) for i, row in zip(store["ids"], store["rows"])}
    last = [json.loads(line) for line in (run_dir / "clients.jsonl").read_text().splitlines()]
    last = {r["node-id"]: r for r in last if r["round"] == 2}
    assert sorted(r["partition-id"] for r in last.values()) == [0, 1]
    assert {nid: r["model-fingerprint"] for nid, r in last.items()} == stored  # its own model, nobody else's
    assert len(set(stored.values())) == 2  # and the two personalized models differ


RUN = "method='fedmcsa' num-rounds=2 clients-per-round=2 eval-every=1 output-dir='{out}'"


@pytest.mark.parametrize("tls,auth", [(False, False), (True, False), (True, True)], ids=["insecure", "tls", "tls+auth"])
def test_two_rounds_of_fedmcsa_on_a_real_superlink_and_supernodes(tmp_path, tls, auth):
    out = tmp_path / "results"
    with LocalDeployment(tmp_path / "deployment", nodes=2, tls=tls, auth=auth) as deployment:
        run = deployment.run(RUN.format(out=out))
        if auth:  # a SuperNode whose key was never registered is turned away
            key, _ = write_node_key(tmp_path / "stranger")
            stranger = deployment.start_supernode("stranger", 0, key, retries=2)
            assert stranger.wait(timeout=120) != 0
            assert "Failed to activate SuperNode" in (tmp_path / "deployment" / "stranger.log").read_text()
            assert sum(n["status"] == "online" for n in deployment.supernodes()) == 2
    assert not deployment.left_running, "processes of the deployment are still running"
    _check_fedmcsa_run(run, out)


def test_killed_serverapp_resumes_on_the_same_supernodes(tmp_path, monkeypatch):
    """Deployment: SIGKILL the ServerApp process after its first checkpoint, resume from the results
    folder on the same SuperLink and SuperNodes (whose clients get their SCAFFOLD c_i back from their
    own disk), and compare with an uninterrupted run."""
    import os
    import signal
    import subprocess
    import time

    from deployment import ROOT, _descendants
    from flower_pfl import checkpoint

    monkeypatch.setenv("FLOWER_PFL_CLIENT_STATE_DIR", str(tmp_path / "client-state"))
    settings = "method='scaffold' num-rounds=4 clients-per-round=2 eval-every=1 checkpoint-every=1 seed=2"
    with LocalDeployment(tmp_path / "deployment", nodes=2) as deployment:
        killed = tmp_path / "killed"
        proc = subprocess.Popen(["flwr", "run", str(ROOT), "deploy", "--stream", "--run-config", f"{settings} output-dir='{killed}'"],
                                cwd=ROOT, env=deployment.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        folder, deadline = None, time.time() + 300
        try:
            while folder is None and time.time() < deadline:
                found = list(killed.glob("*/" + checkpoint.FILE))
                if found and checkpoint.read(found[0])[1]["round"] >= 1:
                    folder = found[0].parent
                time.sleep(0.2)
            assert folder is not None, "no checkpoint was written\n" + deployment.log_tail()
            apps = [pid for p in deployment.procs for pid in _descendants(p.pid)
                    if "flwr-serverapp" in open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace")]
            assert apps, "no ServerApp process found"
            for pid in apps:
                os.kill(pid, signal.SIGKILL)
        finally:
            proc.kill()
            proc.wait()
        assert checkpoint.read(folder / checkpoint.FILE)[1]["round"] < 4
        resumed = deployment.run(f"{settings} resume-from='{folder}' output-dir='{killed}'")
        whole = deployment.run(f"{settings} output-dir='{tmp_path / 'whole'}'")
    assert not deployment.left_running, "processes of the deployment are still running"
    for run in (resumed, whole):
        assert run["status"] == "finished:completed", run["status-details"] + run["log"][-3000:]

    def numbers(run_dir):
        rows = [{k: v for k, v in json.loads(line).items() if k != "elapsed_s"} for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        return rows, (run_dir / "clients.jsonl").read_text().splitlines()

    (whole_dir,) = list((tmp_path / "whole").iterdir())
    assert numbers(folder) == numbers(whole_dir)
