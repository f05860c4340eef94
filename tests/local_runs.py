"""``flwr run`` simulations on a private local SuperLink, and what end-to-end tests compare.

``LocalSimulation`` gives ``flwr run`` its own ``FLWR_HOME`` and ports, so the SuperLink it starts is
the test's alone, and stops that SuperLink and every process it started by PID. ``flwr run --stream``
exits 0 even when a run failed: a run's status is read from ``flwr ls``, once per run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from flower_pfl.run import tensor_files
from flower_pfl.run.results import CHECKPOINT
from flower_pfl.tools import superlink
from flower_pfl.tools.sweep_flwr import free_port, run_config_text

ROOT = Path(__file__).resolve().parents[1]


def flwr_command(*args: str) -> list[str]:
    """``flwr <args>``, with ``flwr`` from this Python's environment."""
    return [superlink.executable("flwr"), *args]


def results(out_dir: Path) -> Path:
    """The one results folder a run wrote into ``out_dir``."""
    (run_dir,) = list(Path(out_dir).iterdir())
    return run_dir


#: an in-process run whose clients train one by one, as ``flwr run``'s and a deployment's ClientApps train
#: them: the same computation, so their numbers agree to the last bit
ONE_BY_ONE = {"batch-clients": False}


def numbers(run_dir: Path) -> tuple[list[dict], list[dict]]:
    """Every metric row and every client evaluation of a run, timings and node ids left out (node ids
    are new in every run and differ between ``flwr run`` and an in-process run)."""
    rows = [{k: v for k, v in json.loads(line).items() if k != "elapsed_s"}
            for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    clients = [{k: v for k, v in json.loads(line).items() if k != "node-id"}
               for line in (Path(run_dir) / "clients.jsonl").read_text().splitlines()]
    return rows, sorted(clients, key=lambda c: (c["round"], c["partition-id"]))


class LocalSimulation:
    """``flwr run`` against a local SuperLink of this object's own (started by the first run).

    ``run`` runs to the end and returns the run's ``flwr ls`` entry with the streamed log under
    ``"log"``; ``start`` starts one in the background; ``stop`` ends the SuperLink and its runs.
    """

    FEDERATION = "client-resources-num-cpus=1"

    def __init__(self, home: Path) -> None:
        self.home = Path(home)
        self.ports = (free_port(), free_port())
        self.env = superlink.environment(FLWR_HOME=str(self.home), FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
                                         FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1",
                                         FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(self.ports[0]),
                                         FLWR_LOCAL_CONTROL_API_PORT=str(self.ports[1]),
                                         FLOWER_PFL_CLIENT_STATE_DIR=str(self.home / "client-state"))
        self.known: set[int] = set()  # ids of the runs seen so far

    def command(self, run_config: Mapping[str, Any], nodes: int, app: Path = ROOT) -> list[str]:
        return flwr_command("run", str(app), "--run-config", run_config_text(run_config),
                            "--federation-config", f"num-supernodes={nodes} {self.FEDERATION}", "--stream")

    def start(self, run_config: Mapping[str, Any], nodes: int, app: Path = ROOT, **popen: Any) -> subprocess.Popen:
        return subprocess.Popen(self.command(run_config, nodes, app), cwd=ROOT, env=self.env, **popen)

    def run(self, run_config: Mapping[str, Any], nodes: int, app: Path = ROOT, timeout: float = 300) -> dict:
        before = set(self.known)
        proc = subprocess.run(self.command(run_config, nodes, app), cwd=ROOT, env=self.env, capture_output=True,
                              text=True, timeout=timeout, check=False)
        new = [r for r in self.runs() if r["run-id"] not in before]
        assert len(new) == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
        return {**new[0], "log": proc.stdout + proc.stderr}

    def runs(self) -> list[dict]:
        """``flwr ls``: every run of this SuperLink, with its status (none before the first run)."""
        out = subprocess.run(flwr_command("ls", "--format", "json"), cwd=ROOT, env=self.env, capture_output=True,
                             text=True, timeout=120, check=False)
        try:
            runs = json.loads(out.stdout).get("runs", [])
        except json.JSONDecodeError:
            return []  # no SuperLink yet
        self.known |= {r["run-id"] for r in runs}
        return runs

    def server_processes(self) -> list[int]:
        """The processes running a ServerApp of this SuperLink (``flwr-simulation``)."""
        return superlink.processes(f"flwr-simulation.*127.0.0.1:{self.ports[0]}")

    def stop(self) -> list[int]:
        """Stop the SuperLink, what it started and any run left behind; returns what still runs."""
        superlink.stop(self.home, self.ports)
        superlink.terminate(superlink.processes(f"flwr-.*127.0.0.1:{self.ports[0]}"), timeout=10.0)
        return superlink.processes(f"(flower-superlink|flwr-).*({self.home}|127.0.0.1:{self.ports[0]})")


def check_results(run_dir: Path, method: str, rounds: int, nodes: int, per_round: int, evaluated: list[int]) -> None:
    """What every finished run writes: its config, a summary, train rows with accepted updates and a
    positive loss, evaluation rows of every node's own model in the ``evaluated`` rounds, a learning curve."""
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and 0.0 < summary["bmta"] <= 1.0 and 0.0 < summary["bmta_weighted"] <= 1.0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["phase"] == "train"]
    assert [r["round"] for r in train] == list(range(1, rounds + 1)) and all(r["train-loss"] > 0 for r in train)
    assert all(r["clients-accepted"] == per_round for r in train)  # accepted / rejected / failed updates are counted
    evals = [r for r in rows if r["phase"] == "evaluate"]
    assert [r["round"] for r in evals] == evaluated and all(r["clients-evaluated"] == nodes for r in evals)
    clients = [json.loads(line) for line in (run_dir / "clients.jsonl").read_text().splitlines()]
    assert len(clients) == nodes * len(evaluated) and {r["partition-id"] for r in clients} == set(range(nodes))
    assert json.loads((run_dir / "config.json").read_text())["method"] == method
    assert (run_dir / "learning_curve.png").stat().st_size > 1000


def kill_after_checkpoint(proc: subprocess.Popen, out_dir: Path, server_round: int, servers: Callable[[], list[int]],
                          details: Callable[[], str] = str, timeout: float = 300) -> Path:
    """Once the run that ``proc`` (its ``flwr run``) started has checkpointed ``server_round`` or a later
    round into ``out_dir``, SIGKILL its ServerApp processes (``servers()``) and ``proc``; returns the
    run's results folder (``details()``: what a failure message adds)."""
    deadline, folder = time.monotonic() + timeout, None
    try:
        while folder is None and time.monotonic() < deadline:
            found = list(Path(out_dir).glob("*/" + CHECKPOINT))
            if found and tensor_files.read(found[0])[1]["round"] >= server_round:
                folder = found[0].parent
            time.sleep(0.2)
        assert folder is not None, "no checkpoint was written\n" + details()
        pids = servers()
        assert pids, "the run's ServerApp process is gone already\n" + details()
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    return folder
