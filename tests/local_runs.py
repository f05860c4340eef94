"""``flwr run`` simulations on a private local SuperLink, and what end-to-end tests compare.

``LocalSimulation`` gives ``flwr run`` its own ``FLWR_HOME`` and ports, so the SuperLink it starts is
the test's alone, and stops that SuperLink and every process it started by PID. ``flwr run --stream``
exits 0 even when a run failed: a run's status is read from ``flwr ls``, once per run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from conftest import SANDBOX

from flower_pfl.run import tensor_files
from flower_pfl.run.cost import COST_KEYS
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
    """Every metric row and every client evaluation of a run, timings, cost and node ids left out (node ids
    are new in every run and differ between ``flwr run`` and an in-process run)."""
    rows = [{k: v for k, v in json.loads(line).items() if k != "elapsed_s" and k not in COST_KEYS}
            for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    clients = [{k: v for k, v in json.loads(line).items() if k != "node-id"}
               for line in (Path(run_dir) / "clients.jsonl").read_text().splitlines()]
    return rows, sorted(clients, key=lambda c: (c["round"], c["partition-id"]))


class Streamed:
    """A process's console output, read as it comes, each line with the second it came in (from ``started``):
    a run that takes too long is described by its phases, and its output is kept whatever happens."""

    #: what a line says about how far a run has got, first match wins
    PHASES = (("Successfully started run", "submitted"), ("Start `flwr-serverapp`", "ServerApp started"),
              ("Starting Flower Simulation", "simulation started"), ("Successfully installed", "app installed"),
              (" round ", "a round"), ("run completed", "completed"), ("run failed", "failed"))

    def __init__(self, proc: subprocess.Popen, started: float | None = None) -> None:
        self.proc, self.started = proc, time.monotonic() if started is None else started
        self.lines: list[tuple[float, str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.monotonic() - self.started, line.rstrip("\n")))

    def wait(self, timeout: float) -> bool:
        """Whether the process ended (and its output was read) within ``timeout`` seconds."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        self._reader.join(timeout=30)
        return True

    def text(self) -> str:
        return "\n".join(line for _, line in self.lines) + "\n"

    def run_id(self) -> int | None:
        """The run ``flwr run`` submitted (it prints the id once the SuperLink has the run)."""
        found = re.search(r"Successfully started run (\d+)", self.text())
        return int(found.group(1)) if found else None

    def phases(self) -> str:
        """When each phase was first and last seen, and the last lines: where a slow run spent its time."""
        seen: dict[str, list[float]] = {}
        for at, line in self.lines:
            phase = next((name for mark, name in self.PHASES if mark in line), None)
            if phase is not None:
                seen.setdefault(phase, [at, at])[1] = at
        now = time.monotonic() - self.started
        told = [f"{name} at {first:.0f} s" + (f" (last at {last:.0f} s)" if last - first >= 1 else "")
                for name, (first, last) in seen.items()] or ["nothing a phase is known by"]
        tail = "\n".join(f"  {at:6.1f} s  {line}" for at, line in self.lines[-8:]) or "  (no output)"
        last = self.lines[-1][0] if self.lines else 0.0
        return (f"after {now:.0f} s: " + "; ".join(told) + f"; its last line came at {last:.0f} s, nothing since for "
                f"{now - last:.0f} s. Its last lines:\n{tail}")


def staged_app(app: Path = ROOT) -> Path:
    """``app`` as ``flwr run`` bundles it (its ``pyproject.toml`` and the files its ``fab-include`` names),
    copied once per test process into a folder of its own. ``flwr run`` walks every file under the folder it is
    given before it picks what to bundle: in a clone holding its virtual environment, tens of thousands of
    files, seconds of every run. Apps without ``fab-include`` (the examples) are used where they are."""
    config = tomllib.loads((app / "pyproject.toml").read_text())
    patterns = config["tool"]["flwr"]["app"].get("fab-include")
    if not patterns:
        return app
    stage = SANDBOX / "staged-apps" / app.name
    if not stage.exists():
        for pattern in ["pyproject.toml", *patterns]:
            for path in app.glob(pattern):
                if path.is_file() and "__pycache__" not in path.parts:
                    (stage / path.relative_to(app)).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(path, stage / path.relative_to(app))
    return stage


class LocalSimulation:
    """``flwr run`` against a local SuperLink of this object's own.

    The SuperLink is started by ``superlink.start``, which waits as long as a loaded machine makes its
    start-up take (``flwr run``'s own start gives up after 15 s), and this home's Flower configuration names its
    address, so that ``flwr run`` neither probes for it (a probe of 0.4 s, which a loaded machine misses) nor
    starts a second one. ``run`` runs to the end and returns the run's ``flwr ls`` entry, found by the id ``flwr
    run`` printed, with the streamed log under ``"log"``; a run that does not end in time is stopped, and the
    failure names the phase it was in. ``start`` starts one in the background; ``stop`` ends the SuperLink and
    its runs, by PID.
    """

    FEDERATION = "client-resources-num-cpus=1"

    def __init__(self, home: Path, ray_address: str | None = None) -> None:
        """``ray_address``: a Ray cluster's, which the runs' simulations join (``RAY_ADDRESS``) instead of
        starting a Ray of their own."""
        self.home = Path(home)
        self.ports = (free_port(), free_port())
        self.env = superlink.environment(FLWR_HOME=str(self.home), FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
                                         FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1",
                                         FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(self.ports[0]),
                                         FLWR_LOCAL_CONTROL_API_PORT=str(self.ports[1]),
                                         FLOWER_PFL_CLIENT_STATE_DIR=str(self.home / "client-state"),
                                         **({"RAY_ADDRESS": ray_address} if ray_address else {}))
        self.started = ""  # how the SuperLink's start went, once it has started

    def ensure_superlink(self) -> None:
        """Start this simulation's SuperLink unless it runs, and name it in the home's configuration."""
        if not superlink.answers(self.ports[0]):
            self.started = superlink.start(self.home, self.ports, env=self.env)[1][0]
            superlink.pin(self.home, self.ports[0])

    def command(self, run_config: Mapping[str, Any], nodes: int, app: Path = ROOT) -> list[str]:
        return flwr_command("run", str(staged_app(app)), "--run-config", run_config_text(run_config),
                            "--federation-config", f"num-supernodes={nodes} {self.FEDERATION}", "--stream")

    def start(self, run_config: Mapping[str, Any], nodes: int, app: Path = ROOT, **popen: Any) -> subprocess.Popen:
        self.ensure_superlink()
        return subprocess.Popen(self.command(run_config, nodes, app), cwd=ROOT, env=self.env, **popen)

    def run(self, run_config: Mapping[str, Any], nodes: int, app: Path = ROOT, timeout: float = 300) -> dict:
        stream = Streamed(self.start(run_config, nodes, app, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        if not stream.wait(timeout):
            raise AssertionError(f"flwr run did not end within {timeout:g} s ({self.started}): {stream.phases()}\n"
                                 + self.stop_run(stream))
        run_id = stream.run_id()
        assert run_id is not None, "flwr run submitted no run\n" + stream.text()[-3000:]
        (entry,) = [r for r in self.runs() if int(r["run-id"]) == run_id]
        return {**entry, "log": stream.text()}

    def stop_run(self, stream: Streamed) -> str:
        """Stop the run ``stream`` shows and its processes, and ``flwr run`` itself: the next test finds
        nothing of it. Says what was stopped."""
        run_id, said = stream.run_id(), []
        if run_id is not None:
            out = subprocess.run(flwr_command("stop", str(run_id)), cwd=ROOT, env=self.env, capture_output=True,
                                 text=True, timeout=120, check=False)
            said.append(f"flwr stop {run_id}: exit {out.returncode}")
        left = superlink.terminate(self.server_processes(), timeout=30.0)
        said += [f"its process {pid}: {how}" for pid, how in left.items()]
        stream.proc.kill()
        stream.wait(30)
        return "; ".join(said) or "no run was submitted"

    def runs(self) -> list[dict]:
        """``flwr ls``: every run of this SuperLink, with its status."""
        out = subprocess.run(flwr_command("ls", "--format", "json"), cwd=ROOT, env=self.env, capture_output=True,
                             text=True, timeout=120, check=False)
        try:
            return json.loads(out.stdout).get("runs", [])
        except json.JSONDecodeError:
            return []  # no SuperLink yet

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
    positive loss, evaluation rows of every node's own model in the ``evaluated`` rounds, a learning curve and
    the partition figure."""
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and 0.0 < summary["bmta"] <= 1.0 and 0.0 < summary["bmta_weighted"] <= 1.0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["phase"] == "train"]
    assert [r["round"] for r in train] == list(range(1, rounds + 1)) and all(r["train-loss"] > 0 for r in train)
    assert all(r["clients-accepted"] == per_round for r in train)  # accepted / rejected / failed updates are counted
    evals = [r for r in rows if r["phase"] == "evaluate"]
    assert [r["round"] for r in evals] == evaluated  # every client: those that train, and those that never do
    assert all(r["clients-evaluated"] + r.get("unseen-clients-evaluated", 0) == nodes for r in evals)
    clients = [json.loads(line) for line in (run_dir / "clients.jsonl").read_text().splitlines()]
    assert len(clients) == nodes * len(evaluated) and {r["partition-id"] for r in clients} == set(range(nodes))
    assert json.loads((run_dir / "config.json").read_text())["method"] == method
    assert (run_dir / "learning_curve.png").stat().st_size > 1000 and (run_dir / "partition.png").stat().st_size > 1000


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
