"""A Ray cluster of a head and worker nodes on loopback, for tests: each node is ``ray start --block``
in a session of its own (its process group holds its raylet, workers and actors), with its own
``--temp-dir``, working folder and explicit ports, so it shares nothing with any other Ray on the
machine; it is stopped by killing that process group (never ``ray stop``, which ends every Ray)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from flower_pfl.tools import superlink
from flower_pfl.tools.sweep_flwr import free_port

PROC = Path("/proc")
#: ``python -c DEATH_WATCH <address> <node manager port> <timeout>``: exits 0 once Ray's node table lists that node dead
DEATH_WATCH = """
import sys, time, ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
deadline = time.monotonic() + float(sys.argv[3])
while any(n["Alive"] for n in ray.nodes() if n["NodeManagerPort"] == int(sys.argv[2])):
    if time.monotonic() > deadline:
        sys.exit(1)
    time.sleep(0.5)
"""


class _Ports:
    """Free ports for one cluster's nodes, none of them twice and none inside a worker range: each node's
    ports are drawn separately, so a range drawn after a single port could otherwise cover it."""

    def __init__(self) -> None:
        self.taken: set[int] = set()

    def one(self) -> int:
        while (port := free_port()) in self.taken:
            pass
        self.taken.add(port)
        return port

    def flags(self, names: tuple[str, ...]) -> list[str]:
        return [f"--{name}={self.one()}" for name in names]

    def worker_range(self, size: int = 40) -> list[str]:
        """A range of ``size`` ports for a node's worker processes, above a free one."""
        while (span := set(range(base := free_port(), base + size + 1))) & self.taken:
            pass
        self.taken |= span
        return [f"--min-worker-port={base}", f"--max-worker-port={base + size}"]


class RayCluster:
    """``start_head`` then ``start_worker`` (as often as wanted); ``address`` is what ``RAY_ADDRESS`` takes."""

    NODE_PORTS = ("node-manager-port", "object-manager-port", "dashboard-agent-listen-port",
                  "dashboard-agent-grpc-port", "runtime-env-agent-port", "metrics-export-port")

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="rc", dir="/tmp"))  # short: Ray's socket paths live under it
        self.ports = _Ports()
        self.port = self.ports.one()
        self.address = f"127.0.0.1:{self.port}"
        self.nodes: dict[str, subprocess.Popen] = {}
        self.node_manager_ports: dict[str, int] = {}  # how Ray's node table names each node

    def _start(self, name: str, args: list[str], cpus: int, timeout: float = 90.0) -> subprocess.Popen:
        cwd = self.root / name
        cwd.mkdir()
        flags = self.ports.flags(self.NODE_PORTS)
        self.node_manager_ports[name] = int(flags[0].split("=")[1])
        command = [superlink.executable("ray"), "start", "--block", f"--num-cpus={cpus}", "--node-ip-address=127.0.0.1",
                   "--disable-usage-stats", "--object-store-memory=200000000", f"--temp-dir={self.root / ('t' + name)}",
                   *self.ports.worker_range(), *flags, *args]
        log = (self.root / f"{name}.log").open("w")
        node = subprocess.Popen(command, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env=superlink.environment())
        self.nodes[name] = node
        deadline = time.monotonic() + timeout
        while "Ray runtime started" not in (self.root / f"{name}.log").read_text():
            if node.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Ray node {name} did not start:\n" + (self.root / f"{name}.log").read_text()[-3000:])
            time.sleep(0.3)
        return node

    def start_head(self, cpus: int) -> None:
        self._start("head", ["--head", f"--port={self.port}", "--include-dashboard=false",
                             f"--ray-client-server-port={self.ports.one()}"], cpus)

    def start_worker(self, name: str, cpus: int) -> None:
        self._start(name, [f"--address={self.address}"], cpus)

    def actors(self) -> dict[str, set[int]]:
        """The virtual-client actors (``ray::ClientAppActor`` processes) alive now, by the node whose
        process group they are in."""
        groups = {node.pid: name for name, node in self.nodes.items()}
        out: dict[str, set[int]] = {}
        for entry in PROC.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                title = (entry / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
                group = os.getpgid(int(entry.name))
            except (OSError, ProcessLookupError):
                continue
            if "ClientAppActor" in title and group in groups:
                out.setdefault(groups[group], set()).add(int(entry.name))
        return out

    def kill(self, name: str) -> None:
        """SIGKILL a node and everything it started (its process group), as a machine that is lost."""
        node = self.nodes[name]
        os.killpg(node.pid, signal.SIGKILL)
        node.wait(timeout=30)

    def wait_until_declared_dead(self, name: str, timeout: float = 180.0) -> float:
        """Wait until the head has declared the killed node ``name`` dead (it misses the node's heartbeats
        for some seconds first); returns the seconds waited. Flower sizes a run's actor pool from the nodes
        Ray lists as alive: a run started before puts actors on the dead node, where they wait minutes."""
        started = time.monotonic()
        probe = subprocess.run([sys.executable, "-c", DEATH_WATCH, self.address, str(self.node_manager_ports[name]), str(timeout)],
                               capture_output=True, text=True, timeout=timeout + 60, env=superlink.environment())
        if probe.returncode != 0:
            raise RuntimeError(f"the head did not declare node {name} dead within {timeout:g} s:\n{probe.stdout[-1500:]}{probe.stderr[-1500:]}")
        return time.monotonic() - started

    def _group(self) -> list[int]:
        """The processes left in this cluster's nodes' process groups."""
        groups = {node.pid for node in self.nodes.values()}
        out = []
        for entry in PROC.iterdir():
            if entry.name.isdigit():
                try:
                    if os.getpgid(int(entry.name)) in groups:
                        out.append(int(entry.name))
                except ProcessLookupError:
                    continue
        return out

    def stop(self) -> list[int]:
        """Stop every node of this cluster (SIGTERM to its process group, SIGKILL to what is left after
        8 s); returns the processes of its groups still alive."""
        for node in self.nodes.values():
            try:
                os.killpg(node.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
        deadline = time.monotonic() + 8
        while self._group() and time.monotonic() < deadline:
            time.sleep(0.2)
        for node in self.nodes.values():
            try:
                os.killpg(node.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            if node.poll() is None:
                node.wait(timeout=10)
        deadline = time.monotonic() + 10
        while self._group() and time.monotonic() < deadline:
            time.sleep(0.2)
        return self._group()
