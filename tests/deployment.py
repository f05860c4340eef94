"""A real deployment on 127.0.0.1: one flower-superlink and flower-supernodes started as
separate processes, driven with the `flwr` CLI, every process stopped at the end."""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from local_runs import ROOT, Streamed, flwr_command, staged_app

from flower_pfl.tools import superlink
from flower_pfl.tools.sweep_flwr import free_port


def _descendants(pid: int) -> set[int]:
    """Processes started by ``pid``, directly or further down, or told its pid (Flower's superexec)."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        parent = todo.pop()
        new = (set(superlink.children(parent)) | set(superlink.processes(f"--parent-pid {parent}( |$)"))) - found - {pid}
        found |= new
        todo.extend(new)
    return found


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _alive(pid: int) -> bool:
    """Running (a zombie waiting to be reaped has stopped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


class LocalDeployment:
    """``with LocalDeployment(tmp, nodes=2, tls=..., auth=...) as d: d.run(...)``.

    ``tls``: certificates from ``flower_pfl.tools.credentials``; ``auth``: SuperNode authentication
    (needs TLS), every SuperNode registered with ``flwr supernode register`` before it starts.
    ``heartbeat``: the interval, in seconds, the SuperNodes declare for their heartbeats (the
    SuperLink declares a node offline after twice that). Flower's SuperNode always declares 30 s and
    has no option for it; the protocol admits 10 s and more, so the SuperNodes start with a
    ``sitecustomize`` that sets Flower's constant before Flower reads it.
    """

    def __init__(self, work: Path, nodes: int = 2, tls: bool = False, auth: bool = False,
                 heartbeat: float | None = None, clients_per_node: int = 1) -> None:
        if auth and not tls:
            raise ValueError("SuperNode authentication needs TLS")
        self.work, self.nodes, self.tls, self.auth = Path(work), nodes, tls, auth
        #: more than 1: SuperNode ``i`` hosts clients ``i·k`` to ``i·k + k − 1`` (node config ``partition-ids``)
        self.clients_per_node = clients_per_node
        self.port = free_port()
        self.home = self.work / "flwr_home"
        self.env = superlink.environment(FLWR_HOME=str(self.home), FLWR_TELEMETRY_ENABLED="0",
                                         FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1", FLWR_DISABLE_UPDATE_CHECK="1")
        self.node_env = dict(self.env)
        if heartbeat is not None:
            site = self.work / "heartbeat"
            site.mkdir(parents=True, exist_ok=True)
            (site / "sitecustomize.py").write_text(
                f"import flwr.common.constant as constant\nconstant.HEARTBEAT_DEFAULT_INTERVAL = {heartbeat!r}\n")
            self.node_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
        self.procs: list[subprocess.Popen] = []
        self.logs: list[Path] = []

    # ------------------------------------------------------------------ processes
    def _start(self, name: str, args: Sequence[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        log = self.work / f"{name}.log"
        self.logs.append(log)
        proc = subprocess.Popen(list(args), cwd=self.work, env=env or self.env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.procs.append(proc)
        return proc

    def __enter__(self) -> LocalDeployment:
        self.work.mkdir(parents=True, exist_ok=True)
        self.home.mkdir(exist_ok=True)
        from flower_pfl.tools.credentials import write_node_key, write_tls_certificates

        link = [superlink.executable("flower-superlink"), "--port", str(self.port)]
        if self.tls:
            self.certs = write_tls_certificates(self.work / "certs")
            link += ["--ssl-ca-certfile", str(self.certs["ca"]), "--ssl-certfile", str(self.certs["certificate"]),
                     "--ssl-keyfile", str(self.certs["key"])]
        else:
            link.append("--insecure")
        if self.auth:
            link.append("--enable-supernode-auth")
        self._write_connection()
        try:
            self._start("superlink", link)
            self._wait_healthy()
            for i in range(self.nodes):
                key = None
                if self.auth:
                    key, public = write_node_key(self.work / "keys" / f"node{i}")
                    self.flwr("supernode", "register", str(public), "deploy")
                self.start_supernode(f"supernode{i}", i, key)
            self._wait_online()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def start_supernode(self, name: str, partition_id: int, key: Path | None = None, retries: int = 30) -> subprocess.Popen:
        """One more SuperNode (``key``: its authentication key, whether registered or not)."""
        k = self.clients_per_node
        hosted = f"partition-id={partition_id} num-partitions={self.nodes}" if k == 1 else \
            f"partition-id={partition_id} partition-ids='{partition_id * k}-{partition_id * k + k - 1}' num-partitions={self.nodes * k}"
        node = [superlink.executable("flower-supernode"), "--superlink", f"127.0.0.1:{self.port}", "--port", str(free_port()),
                "--node-config", hosted, "--max-retries", str(retries)]
        node += ["--root-certificates", str(self.certs["ca"])] if self.tls else ["--insecure"]
        if key is not None:
            node += ["--auth-supernode-private-key", str(key)]
        return self._start(name, node, self.node_env)

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop every process this deployment started and all they started (superexec, apps)."""
        family = set().union(*(_descendants(p.pid) for p in self.procs if p.poll() is None))
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for pid in family:
            _signal(pid, signal.SIGTERM)
        deadline = time.time() + 20
        while (any(p.poll() is None for p in self.procs) or any(_alive(p) for p in family)) and time.time() < deadline:
            time.sleep(0.3)
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
        for pid in family:
            if _alive(pid):
                _signal(pid, signal.SIGKILL)
        time.sleep(0.5)
        self.left_running = [p for p in family if _alive(p)]

    # ------------------------------------------------------------------ CLI
    def _write_connection(self) -> None:
        lines = ["[superlink]", 'default = "deploy"', "", "[superlink.deploy]", f'address = "127.0.0.1:{self.port}"']
        lines += [f'root-certificates = "{self.work / "certs" / "ca.crt"}"'] if self.tls else ["insecure = true"]
        (self.home / "config.toml").write_text("\n".join(lines) + "\n")

    def flwr(self, *args: str, timeout: int = 120) -> subprocess.CompletedProcess:
        """``flwr <args>`` with this deployment's FLWR_HOME; a failure raises with the logs."""
        proc = subprocess.run(flwr_command(*args), cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"flwr {' '.join(args)} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}\n{self.log_tail()}")
        return proc

    def _wait_healthy(self, timeout: float = 60) -> None:
        scheme = "https" if self.tls else "http"
        context = ssl.create_default_context(cafile=str(self.certs["ca"])) if self.tls else None
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"{scheme}://127.0.0.1:{self.port}/health", timeout=2, context=context) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        raise TimeoutError(f"the SuperLink did not become healthy\n{self.log_tail()}")

    def supernodes(self) -> list[dict]:
        """``flwr supernode ls``: the SuperLink's nodes and their status."""
        out = self.flwr("supernode", "ls", "deploy", "--format", "json").stdout
        return json.loads(out).get("nodes", [])

    def _wait_online(self, timeout: float = 90) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if sum(n.get("status") == "online" for n in self.supernodes()) == self.nodes:
                return
            time.sleep(1)
        raise TimeoutError(f"not every SuperNode came online: {self.supernodes()}\n{self.log_tail()}")

    def start_run(self, run_config: str, app: Path = ROOT) -> Streamed:
        """``flwr run`` in the background, its output streamed (``Streamed``)."""
        return Streamed(subprocess.Popen(flwr_command("run", str(staged_app(app)), "deploy", "--stream", "--run-config", run_config),
                                         cwd=ROOT, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))

    def run(self, run_config: str, app: Path = ROOT, timeout: int = 480) -> dict:
        """``flwr run`` to the end; returns the run's entry of ``flwr ls``, found by the id ``flwr run`` printed (its
        status is the truth: ``flwr run --stream`` exits 0 even when the run failed), with the streamed log. A run
        that does not end within ``timeout`` seconds is stopped, and the failure names the phase it was in."""
        return self.finish(self.start_run(run_config, app), timeout)

    def finish(self, stream: Streamed, timeout: float = 480) -> dict:
        """``run``'s end of a run ``start_run`` started."""
        if not stream.wait(timeout):
            run_id = stream.run_id()
            if run_id is not None:
                subprocess.run(flwr_command("stop", str(run_id), "deploy"), cwd=ROOT, env=self.env, capture_output=True,
                               timeout=120, check=False)
            stream.proc.kill()
            raise AssertionError(f"flwr run did not end within {timeout:g} s: {stream.phases()}\n{self.log_tail()}")
        run_id = stream.run_id()
        if run_id is None:
            raise RuntimeError(f"flwr run submitted no run\n{stream.text()[-3000:]}\n{self.log_tail()}")
        (entry,) = [r for r in self.runs() if int(r["run-id"]) == run_id]
        return {**entry, "log": stream.text()}

    def runs(self) -> list[dict]:
        """``flwr ls``: every run with its status."""
        return json.loads(self.flwr("ls", "deploy", "--format", "json").stdout).get("runs", [])

    def log_tail(self, chars: int = 1500) -> str:
        """The end of every process's log, for failure messages."""
        return "\n".join(f"--- {log.name}\n{log.read_text()[-chars:]}" for log in self.logs if log.exists())
