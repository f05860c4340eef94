"""The sweep's ``flwr-run`` engine: each cell through ``flwr run`` on a local SuperLink of its own.

The engine starts the SuperLink under the sweep's own ``FLWR_HOME`` and ports before the first cell
(``superlink.start``, which waits however long the machine takes to start it) and names it in that
home's Flower configuration, so sweeps never share one with each other or with a user's, and ``flwr
run`` neither races Flower's own start-up limit nor starts a second one; ``stop`` ends it (and the
processes it started) by PID. A cell's console output goes to ``flwr.log`` in its folder.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flower_pfl.tools import superlink
from flower_pfl.tools.sweep_grid import Cell, SweepError, finished, unfinished_reason

#: this project's Flower app (``pyproject.toml`` with ``[tool.flwr.app]``)
PROJECT = Path(__file__).resolve().parents[2]
#: one CPU per virtual client, as the documentation's commands give them: one client per core trains at a time
#: (Flower's default of 2 lets half as many train; ``benchmarks/speed.py`` measures both)
RESOURCES = {"client-resources-num-cpus": 1}


def free_port() -> int:
    """A port nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def toml_value(value: Any) -> str:
    """A run-config value as ``flwr run --run-config`` reads it (TOML)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        if '"' in value and "'" not in value and "\n" not in value:
            return f"'{value}'"  # a TOML literal string: Flower's parser of --run-config takes no escaped quotes
        return json.dumps(value)
    raise SweepError(f"run-config value {value!r} cannot be passed to flwr run")


def run_config_text(run_config: Mapping[str, Any]) -> str:
    return " ".join(f"{key}={toml_value(value)}" for key, value in run_config.items())


class FlwrRunEngine:
    """Runs cells with ``flwr run <app> --stream`` against a private local SuperLink."""

    def __init__(self, home: Path, app: Path | None = None, federation: Mapping[str, Any] | None = None) -> None:
        """``federation``: ``--federation-config`` entries besides ``num-supernodes`` (default ``RESOURCES``)."""
        self.federation = dict(RESOURCES if federation is None else federation)
        self.app = Path(app or PROJECT).resolve()
        if not (self.app / "pyproject.toml").exists():
            raise SweepError(f"{self.app} is not a Flower app folder (no pyproject.toml); pass --app")
        self.home = Path(home).resolve()
        self.home.mkdir(parents=True, exist_ok=True)
        self.port, self.control_port = free_port(), free_port()
        self.env = superlink.environment(FLWR_HOME=str(self.home), FLWR_TELEMETRY_ENABLED="0",
                                         FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
                                         FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(self.port),
                                         FLWR_LOCAL_CONTROL_API_PORT=str(self.control_port))
        self._starting = threading.Lock()  # the first cell starts the SuperLink; the others wait for it

    def start(self) -> None:
        """Start this engine's SuperLink unless it answers, and name it in the home's configuration
        (``superlink.start``, ``superlink.pin``); raises ``superlink.StartError``. The first cell calls it;
        a caller running ``command`` lines itself calls it first."""
        with self._starting:
            if not superlink.answers(self.port):
                superlink.start(self.home, (self.port, self.control_port), env=self.env)
                superlink.pin(self.home, self.port)

    def run_cell(self, cell: Cell) -> dict[str, Any]:
        try:
            self.start()
        except superlink.StartError as err:
            return {"status": "failed", "error": f"the sweep's SuperLink: {err}"}
        return self._run(cell)

    def command(self, cell: Cell) -> list[str]:
        """The ``flwr run`` command line of ``cell`` (run it in ``self.app`` with ``self.env``). The clients keep
        their state in this engine's folder unless the cell names one: the run config reaches every client
        (on a Ray cluster too), the environment of ``flwr run`` does not."""
        run_config = {**cell.run_config, "client-state-dir": cell.run_config.get("client-state-dir") or str(self.home / "client-state")}
        return [superlink.executable("flwr"), "run", str(self.app), "--run-config", run_config_text(run_config),
                "--federation-config", run_config_text({"num-supernodes": cell.nodes_for(os.cpu_count() or 1), **self.federation}),
                "--stream"]

    def _run(self, cell: Cell) -> dict[str, Any]:
        log = cell.folder / "flwr.log"
        with log.open("w") as fh:
            subprocess.run(self.command(cell), cwd=self.app, env=self.env, stdout=fh, stderr=subprocess.STDOUT, check=False)
        folder = finished(cell)  # `flwr run --stream` exits 0 even when the run failed: the folder tells
        if folder is not None:
            return {"status": "completed", "results_dir": str(folder)}
        tail = log.read_text()[-1500:].strip().splitlines()
        return {"status": "failed", "error": f"{unfinished_reason(cell)}; see {log}: " + " | ".join(tail[-5:])}

    def stop(self) -> None:
        """End this engine's SuperLink and what it started (by PID, ``flower_pfl.tools.superlink.stop``:
        nothing of anyone else's), and any run of it that did not finish."""
        superlink.stop(self.home, (self.port, self.control_port))
        superlink.terminate(superlink.processes(f"flwr-.*127.0.0.1:{self.port}"), timeout=10.0)
