"""End to end through `flwr run`: a private local SuperLink, Ray-backed virtual clients.

The SuperLink runs with its own FLWR_HOME and ports and is stopped (by PID) at the end.
`flwr run --stream` exits 0 even when a run failed, so every check reads the run's
status from `flwr ls` and the files the run wrote.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from deployment import free_port
from flower_pfl.results import MODELS, SERVER_STATE, load_models, load_state
from flower_pfl.wire import fingerprint

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.e2e


def _pids(pattern: str) -> list[int]:
    out = subprocess.run(["pgrep", "-f", "--", pattern], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


@pytest.fixture(scope="module")
def flwr_env(tmp_path_factory):
    home = tmp_path_factory.mktemp("flwr_home")
    env = {
        **os.environ,
        "FLWR_HOME": str(home),
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(free_port()),
        "FLWR_LOCAL_CONTROL_API_PORT": str(free_port()),
        "FLOWER_PFL_CLIENT_STATE_DIR": str(home / "client-state"),  # where nodes keep their state for resumed runs
    }
    yield env
    port = env["FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"]
    for pid in _pids(f"flower-superlink.*{home}"):
        for child in _pids(f"--parent-pid {pid}"):
            os.kill(child, signal.SIGTERM)
        os.kill(pid, signal.SIGTERM)
    for pid in _pids(f"flwr-.*127.0.0.1:{port}"):  # a run that did not finish (flwr-simulation, ...)
        os.kill(pid, signal.SIGTERM)
    deadline = time.time() + 20
    while _pids(f"flower-superlink.*{home}") and time.time() < deadline:
        time.sleep(0.5)
    assert not _pids(f"flower-superlink.*{home}"), "the test's SuperLink is still running"


def _flwr_run(env, run_config: str, nodes: int, app: Path = ROOT) -> dict:
    before = {r["run-id"] for r in _runs(env)}
    proc = subprocess.run(
        ["flwr", "run", str(app), "--run-config", run_config, "--federation-config", f"num-supernodes={nodes} client-resources-num-cpus=1", "--stream"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    new = [r for r in _runs(env) if r["run-id"] not in before]
    assert len(new) == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {**new[0], "log": proc.stdout + proc.stderr}


def _runs(env) -> list[dict]:
    out = subprocess.run(["flwr", "ls", "--format", "json"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    try:
        return json.loads(out.stdout).get("runs", [])
    except json.JSONDecodeError:
        return []  # no SuperLink yet


def _results(out_dir: Path) -> Path:
    (run_dir,) = list(out_dir.iterdir())
    return run_dir


@pytest.mark.parametrize("method,api", [("fedmcsa", "message"), ("fedmcsa", "legacy"), ("scaffold", "message"), ("igfl", "legacy"),
                                         ("fedattn", "message")])
def test_flwr_run_finishes_and_writes_metrics(flwr_env, tmp_path, method, api):
    rounds = 3
    run = _flwr_run(flwr_env, f"method='{method}' api='{api}' num-rounds={rounds} clients-per-round=4 eval-every=1 "
                              f"output-dir='{tmp_path}'", nodes=6)
    assert run["status"] == "finished:completed", run["status-details"] + run["log"][-3000:]
    run_dir = _results(tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert 0.0 < summary["bmta"] <= 1.0 and 0.0 < summary["bmta_weighted"] <= 1.0
    assert summary["evaluated_rounds"] == rounds
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if r["phase"] == "evaluate"]
    assert [r["round"] for r in evals] == [1, 2, 3]
    assert all(r["clients-evaluated"] == 6 for r in evals)  # every client evaluated its own model
    train = [r for r in rows if r["phase"] == "train"]
    assert len(train) == rounds and all(r["train-loss"] > 0 for r in train)
    assert all(r["clients-accepted"] == 4 for r in train)  # our strategies count accepted / rejected / failed updates
    clients = [json.loads(line) for line in (run_dir / "clients.jsonl").read_text().splitlines()]
    assert len(clients) == 6 * rounds and {r["partition-id"] for r in clients} == set(range(6))
    assert (run_dir / MODELS).exists() == (method == "fedmcsa")
    if method == "fedmcsa":  # each node evaluated the model stored for it
        store = dict(zip(("ids", "rows", "initial"), load_models(run_dir / MODELS)))
        stored = {int(i): fingerprint([row]) for i, row in zip(store["ids"], store["rows"])}
        assert {r["node-id"]: r["model-fingerprint"] for r in clients if r["round"] == rounds} == stored
    assert json.loads((run_dir / "config.json").read_text())["method"] == method
    assert (run_dir / "learning_curve.png").stat().st_size > 1000
    if method == "fedattn":  # the attention module is saved with the results
        assert set(load_state(run_dir / SERVER_STATE)["attention"]) == {"w_q", "w_k", "w_v"}


def test_bad_run_config_stops_the_run_with_a_clear_message(flwr_env, tmp_path):
    run = _flwr_run(flwr_env, f"sigma=-1.0 output-dir='{tmp_path}'", nodes=2)
    assert run["status"] == "finished:failed"
    assert "'sigma'" in run["status-details"] and "> 0" in run["status-details"]
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_a_run_that_accepts_no_update_ends_failed_and_says_why(flwr_env, tmp_path):
    """lr = 1e30: every update is refused by the update bound; the run must not report success."""
    run = _flwr_run(flwr_env, f"method='fedmcsa' lr=1e30 num-rounds=4 clients-per-round=2 eval-every=4 output-dir='{tmp_path}'",
                    nodes=2)
    assert run["status"] == "finished:failed", run["status"]
    assert "accepted no client update" in run["status-details"] + run["log"]
    assert "rejected (" in run["log"]  # each refusal is logged with its reason
    summary = json.loads((_results(tmp_path) / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["idle_rounds"] == 3


def test_many_clients_partial_participation(flwr_env, tmp_path):
    run = _flwr_run(flwr_env, f"method='fedacs' train-samples-per-client=50 num-rounds=2 "
                              f"clients-per-round=50 eval-every=2 output-dir='{tmp_path}'", nodes=500)
    assert run["status"] == "finished:completed", run["status-details"] + run["log"][-3000:]
    rows = [json.loads(line) for line in (_results(tmp_path) / "metrics.jsonl").read_text().splitlines()]
    assert [r["clients-accepted"] for r in rows if r["phase"] == "train"] == [50, 50]
    assert [r["clients-evaluated"] for r in rows if r["phase"] == "evaluate"] == [500, 500]  # rounds 1 and 2


def _accuracies(log: str, pattern: str) -> list[float]:
    return [float(a) for a in re.findall(pattern, log)]


def test_own_legacy_app_with_fedacs_swapped_in(flwr_env):
    """examples/legacy_app: a NumPyClient with plain SGD; the ServerApp's FedAvg replaced by FedACS."""
    run = _flwr_run(flwr_env, "num-rounds=3", nodes=6, app=ROOT / "examples" / "legacy_app")
    assert run["status"] == "finished:completed", run["status-details"] + run["log"][-3000:]
    assert "History (metrics, distributed, evaluate)" in run["log"], run["log"][-3000:]
    assert "'accuracy'" in run["log"] and "'clients-accepted'" in run["log"]


def test_plain_app_names_its_strategy_and_metric(flwr_env):
    """examples/plain_app under ``flwr run``: a plain client reporting ``eval-acc``; the ServerApp builds
    FedMCSA from its import path with ``accuracy_key="eval-acc"``. The client ignores FedMCSA's proximal
    term, and the run says so once and completes with the app's metric names."""
    config = "strategy='strategies.message.FedMCSA' strategy-args='{\"accuracy_key\": \"eval-acc\"}' num-rounds=3"
    run = _flwr_run(flwr_env, config, nodes=6, app=ROOT / "examples" / "plain_app")
    assert run["status"] == "finished:completed", run["status-details"] + run["log"][-3000:]
    accuracies = _accuracies(run["log"], r"plain-app: round \d+ eval-acc ([0-9.]+)")
    assert len(accuracies) == 3 and all(0 <= a <= 1 for a in accuracies), run["log"][-3000:]
    assert "'eval-acc-mean'" in run["log"] and "'eval-acc-bmta'" in run["log"], run["log"][-3000:]
    assert run["log"].count("receipt 'client-step' = 'proximal-mu'") == 1, run["log"][-3000:]


@pytest.mark.parametrize("method", ["fedmcsa", "scaffold", "igfl"])
def test_own_message_app_with_a_client_side_rule(flwr_env, method):
    """examples/message_app: the user's own loop with ``ClientRule`` hooks (FedMCSA's proximal
    term; SCAFFOLD's correction, whose Δc_i travels back in the reply; IGFL-C, whose Δw_i stays in the state)."""
    run = _flwr_run(flwr_env, f"method='{method}' num-rounds=3 clients-per-round=6", nodes=6, app=ROOT / "examples" / "message_app")
    assert run["status"] == "finished:completed", run["status-details"] + run["log"][-3000:]
    accuracies = _accuracies(run["log"], r"message-app: round \d+ accuracy ([0-9.]+)")
    assert len(accuracies) == 3, run["log"][-3000:]
    # every update, and every control-variate delta, was accepted
    assert "'clients-accepted': 6" in run["log"] and "'clients-rejected': 0" in run["log"] and "rejected (" not in run["log"]


def _numbers(run_dir: Path) -> tuple[list[dict], list[dict]]:
    """Every metric row and client evaluation of a run, timings left out."""
    rows = [{k: v for k, v in json.loads(line).items() if k != "elapsed_s"}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    clients = [{k: v for k, v in json.loads(line).items() if k != "node-id"}  # node ids are new every run
               for line in (run_dir / "clients.jsonl").read_text().splitlines()]
    return rows, sorted(clients, key=lambda c: (c["round"], c["partition-id"]))


@pytest.mark.parametrize("method,api", [("fedavg", "message"), ("scaffold", "legacy")])
def test_same_seed_same_numbers_under_flwr_run(flwr_env, tmp_path, method, api):
    """Flower's own FedAvg and one of this package's strategies (legacy API, whose server gathers
    results on threads): two ``flwr run``s with one seed give the same numbers, to the last bit,
    although the runtime's threads draw from Python's global ``random`` and node ids change."""
    numbers = []
    for name in ("a", "b"):
        out = tmp_path / name
        run = _flwr_run(flwr_env, f"method='{method}' api='{api}' num-rounds=3 clients-per-round=3 eval-every=1 seed=3 "
                                  f"output-dir='{out}'", nodes=6)
        assert run["status"] == "finished:completed", run["status-details"] + run["log"][-3000:]
        numbers.append(_numbers(_results(out)))
    assert numbers[0] == numbers[1]
    assert len(numbers[0][0]) == 6 and len(numbers[0][1]) == 18  # 3 train and 3 evaluation rows; 6 clients x 3 rounds


@pytest.mark.parametrize("method", ["fedmcsa", "fedattn", "scaffold"])
def test_server_killed_mid_run_resumes_to_the_uninterrupted_numbers(flwr_env, tmp_path, method):
    """A personalized method, a global-model method and one whose clients keep state (SCAFFOLD's
    c_i, restored from the nodes' disks): SIGKILL the ServerApp's process after its first
    checkpoint, resume from the results folder, and compare with a run that was never interrupted."""
    from flower_pfl import checkpoint

    settings = f"method='{method}' num-rounds=8 clients-per-round=3 eval-every=2 checkpoint-every=2 seed=4"
    cmd = ["flwr", "run", str(ROOT), "--run-config", f"{settings} output-dir='{tmp_path / 'killed'}'",
           "--federation-config", "num-supernodes=6 client-resources-num-cpus=1", "--stream"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=flwr_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    port = flwr_env["FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"]
    deadline, folder = time.time() + 300, None
    try:
        while time.time() < deadline:
            found = list((tmp_path / "killed").glob("*/" + checkpoint.FILE))
            if found and checkpoint.read(found[0])[1]["round"] >= 2:
                folder = found[0].parent
                break
            time.sleep(0.2)
        assert folder is not None, "no checkpoint was written"
        servers = _pids(f"flwr-simulation.*127.0.0.1:{port}")
        assert servers, "the run's ServerApp process is gone already"
        for pid in servers:
            os.kill(pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    done = checkpoint.read(folder / checkpoint.FILE)[1]["round"]
    assert done < 8, "the run finished before it was killed"

    resumed = _flwr_run(flwr_env, f"{settings} resume-from='{folder}' output-dir='{tmp_path / 'killed'}'", nodes=6)
    assert resumed["status"] == "finished:completed", resumed["status-details"] + resumed["log"][-3000:]
    whole = _flwr_run(flwr_env, f"{settings} output-dir='{tmp_path / 'whole'}'", nodes=6)
    assert whole["status"] == "finished:completed", whole["status-details"] + whole["log"][-3000:]
    assert _numbers(folder) == _numbers(_results(tmp_path / "whole"))
    assert [r["round"] for r in _numbers(folder)[0] if r["phase"] == "evaluate"] == [1, 2, 4, 6, 8]
