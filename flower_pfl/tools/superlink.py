"""Start, show or stop the local SuperLink that ``flwr run`` uses.

``flwr run`` (Flower 1.41 and 1.42, ``flwr/cli/local_superlink.py``) starts ``flower-superlink`` on fixed
ports (``FLWR_LOCAL_SUPERLINK_HTTP_API_PORT``, default 39091, and ``FLWR_LOCAL_CONTROL_API_PORT``,
default 39093) with its log and database in ``$FLWR_HOME/local-superlink/``, keeps no PID file, and
gives up when it does not answer within 15 s (a loaded machine can take longer). ``start`` starts
the same SuperLink and waits until it answers, up to ``--timeout`` seconds; ``flwr run`` then uses it.
``status`` and ``stop`` find the process listening on those ports whose command line names this
``FLWR_HOME``'s ``local-superlink`` folder; ``stop`` stops it and the processes it started (the runs
it executes) by PID: SIGTERM, then SIGKILL for what is still there after ``--timeout`` seconds.

    python -m flower_pfl superlink start
    python -m flower_pfl superlink status
    python -m flower_pfl superlink stop

Linux reads ``/proc``; elsewhere ``lsof``, ``ps`` and ``pgrep``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
LISTEN = "0A"  # socket state in /proc/net/tcp
KILL_WAIT = 5.0  # seconds a SIGKILLed process gets to disappear
STILL_RUNNING = "still running (not stopped: another user's process?)"
#: seconds ``start`` waits for the SuperLink to answer (``flwr run`` waits 15)
START_TIMEOUT = 120.0


class StartError(RuntimeError):
    """The SuperLink did not start, or did not answer in time; the message says which and where its log is."""


@dataclass(frozen=True)
class Listener:
    """A process listening on some of the ports looked at."""

    pid: int
    ports: tuple[int, ...]
    cmdline: tuple[str, ...]

    def describe(self) -> str:
        return f"pid {self.pid} (port {', '.join(map(str, self.ports))}): {' '.join(self.cmdline)}"


def local_ports() -> tuple[int, int]:
    """The local SuperLink's HTTP API and Control API ports, as ``flwr run`` reads them."""
    return (int(os.environ.get("FLWR_LOCAL_SUPERLINK_HTTP_API_PORT", "39091")),
            int(os.environ.get("FLWR_LOCAL_CONTROL_API_PORT", "39093")))


def flwr_home() -> Path:
    """``$FLWR_HOME``, default ``~/.flwr`` (as Flower resolves it)."""
    return Path(os.environ.get("FLWR_HOME") or Path.home() / ".flwr").expanduser()


def _proc_listening_inodes(ports: set[int]) -> dict[str, int]:
    """Socket inode -> port, for TCP sockets listening on ``ports``."""
    inodes: dict[str, int] = {}
    for table in ("tcp", "tcp6"):
        path = PROC / "net" / table
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            port = int(fields[1].rsplit(":", 1)[1], 16)
            if fields[3] == LISTEN and port in ports:
                inodes[fields[9]] = port
    return inodes


def _proc_listeners(ports: set[int]) -> dict[int, set[int]]:
    inodes = _proc_listening_inodes(ports)
    found: dict[int, set[int]] = {}
    if not inodes:
        return found
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            links = [os.readlink(fd) for fd in (entry / "fd").iterdir()]
        except OSError:  # gone, or another user's
            continue
        for link in links:
            if link.startswith("socket:[") and (port := inodes.get(link[8:-1])) is not None:
                found.setdefault(int(entry.name), set()).add(port)
    return found


def _lsof_listeners(ports: set[int]) -> dict[int, set[int]]:
    found: dict[int, set[int]] = {}
    for port in ports:
        out = subprocess.run(["lsof", "-nP", f"-iTCP:{port}", "-sTCP:LISTEN", "-t"], capture_output=True, text=True).stdout
        for pid in out.split():
            found.setdefault(int(pid), set()).add(port)
    return found


def cmdline(pid: int) -> tuple[str, ...]:
    """A process's command line (empty when it is gone or unreadable)."""
    if PROC.exists():
        try:
            return tuple(arg for arg in (PROC / str(pid) / "cmdline").read_bytes().decode().split("\0") if arg)
        except OSError:
            return ()
    return tuple(subprocess.run(["ps", "-o", "command=", "-p", str(pid)], capture_output=True, text=True).stdout.split())


def children(pid: int) -> list[int]:
    """The processes ``pid`` started that are still running."""
    if not PROC.exists():
        out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]
    found = []
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:  # the field after the state is the parent's pid
                found.append(int(entry.name))
    return found


def descendants(pid: int) -> set[int]:
    """The processes ``pid`` started, directly or further down, that are still running."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        new = set(children(todo.pop())) - found
        found |= new
        todo.extend(new)
    return found


def processes(pattern: str) -> list[int]:
    """The running processes whose command line matches the regular expression ``pattern``, this one
    left out (what ``pgrep -f`` finds, without needing ``pgrep``)."""
    if not PROC.exists():
        out = subprocess.run(["pgrep", "-f", "--", pattern], capture_output=True, text=True).stdout
        return [int(p) for p in out.split() if int(p) != os.getpid()]
    regex, found = re.compile(pattern), []
    for entry in PROC.iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            pid = int(entry.name)
            if regex.search(" ".join(cmdline(pid))) and _alive(pid):
                found.append(pid)
    return found


def executable(name: str) -> str:
    """Flower's command ``name`` (``flwr``, ``flower-superlink``, ...) from this Python's environment,
    so that a virtual environment works without being on ``PATH``; else the one on ``PATH``."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else shutil.which(name) or name


def environment(**variables: str) -> dict[str, str]:
    """This process's environment plus ``variables``, with this Python's scripts folder first on
    ``PATH``: Flower starts ``flower-superlink``, ``flower-superexec`` and its apps by name."""
    scripts = str(Path(sys.executable).parent)
    path = os.pathsep.join([scripts, *(p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != scripts)])
    return {**os.environ, "PATH": path, **variables}


def listeners(ports: Iterable[int]) -> list[Listener]:
    """The processes listening on ``ports``, by pid."""
    wanted = set(ports)
    found = _proc_listeners(wanted) if (PROC / "net" / "tcp").exists() else _lsof_listeners(wanted)
    return [Listener(pid, tuple(sorted(p)), cmdline(pid)) for pid, p in sorted(found.items())]


def belongs_to(listener: Listener, home: Path) -> bool:
    """Whether the listener is the SuperLink ``flwr run`` started for ``home``: its log file and
    database lie in ``home/local-superlink`` (as given, e.g. relative, or resolved)."""
    folders = tuple({str(h / "local-superlink") + os.sep for h in (home, home.expanduser().resolve())})
    return any(arg.startswith(folders) for arg in listener.cmdline)


def find(home: Path, ports: Sequence[int]) -> tuple[list[Listener], list[Listener]]:
    """``(this home's local SuperLink, other processes on its ports)``."""
    found = listeners(ports)
    return [p for p in found if belongs_to(p, home)], [p for p in found if not belongs_to(p, home)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped by its parent) has stopped
        return (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def terminate(pids: Sequence[int], timeout: float) -> dict[int, str]:
    """SIGTERM ``pids``, wait up to ``timeout`` seconds, SIGKILL what is left; pid -> what happened
    (``STILL_RUNNING`` for a process that survived, e.g. another user's)."""
    how = {pid: "stopped" for pid in pids}
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            how[pid] = "already gone"
        except PermissionError:
            how[pid] = STILL_RUNNING
    _wait([p for p in pids if how[p] == "stopped"], timeout)
    for pid in pids:
        if how[pid] == "stopped" and _alive(pid):
            os.kill(pid, signal.SIGKILL)
            how[pid] = f"killed (SIGKILL: still running {timeout:g} s after SIGTERM)"
    _wait([p for p in pids if how[p].startswith("killed")], KILL_WAIT)
    return {pid: STILL_RUNNING if _alive(pid) else what for pid, what in how.items()}


def _wait(pids: Sequence[int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)


def folder(home: Path) -> Path:
    """Where the local SuperLink of ``home`` keeps its database and log (as ``flwr run`` places them)."""
    return Path(home) / "local-superlink"


def command(home: Path, ports: Sequence[int]) -> list[str]:
    """The command line ``flwr run`` starts the local SuperLink of ``home`` with, on ``ports`` (HTTP API,
    Control API): a simulation SuperLink whose runs execute in processes of their own."""
    port, control = ports
    return [executable("flower-superlink"), "--insecure", "--simulation", "--isolation", "subprocess",
            "--control-api-address", f"127.0.0.1:{control}", "--host", "127.0.0.1", "--port", str(port),
            "--log-file", str(folder(home) / "superlink.log"), "--log-rotation-interval-hours", "24",
            "--log-rotation-backup-count", "7", "--database", str(folder(home) / "state.db")]


def answers(port: int, timeout: float = 2.0) -> bool:
    """Whether a SuperLink answers its health check on ``port``."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=timeout) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def start(home: Path, ports: Sequence[int], timeout: float = START_TIMEOUT,
          env: dict[str, str] | None = None) -> tuple[int, list[str]]:
    """Start the local SuperLink of ``home`` on ``ports`` as ``flwr run`` would, detached, and wait until it
    answers (up to ``timeout`` seconds, however long its start-up takes); ``(pid, lines)``. ``env``: its
    environment (default: this one, with this Python's scripts folder first on ``PATH``, ``environment``). A SuperLink of
    this home already running is kept. Raises ``StartError`` when the ports are another process's, when the
    SuperLink exits, or when it does not answer in time (then it is stopped), naming its log."""
    home = Path(home).expanduser().resolve()
    mine, others = find(home, ports)
    if mine:
        return mine[0].pid, [f"local SuperLink of FLWR_HOME={home} already runs: {mine[0].describe()}"]
    if others:
        raise StartError(f"ports {', '.join(map(str, ports))} are taken by another process: "
                         + "; ".join(p.describe() for p in others))
    folder(home).mkdir(parents=True, exist_ok=True)
    log = folder(home) / "superlink.log"
    # Flower's processes the SuperLink starts by name (flower-superexec, the runs) come from its environment
    environment_ = {**(env if env is not None else environment()), "FLWR_HOME": str(home), "FLWR_DISABLE_UPDATE_CHECK": "1"}
    started = time.monotonic()
    process = subprocess.Popen(command(home, ports), env=environment_, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    while not answers(ports[0]):
        if process.poll() is not None:
            raise StartError(f"flower-superlink exited with code {process.returncode} before it answered; see {log}")
        if time.monotonic() - started > timeout:
            terminate([process.pid], KILL_WAIT)
            raise StartError(f"flower-superlink (pid {process.pid}) did not answer within {timeout:g} s; see {log}")
        time.sleep(0.2)
    return process.pid, [f"local SuperLink of FLWR_HOME={home}: pid {process.pid} (port {ports[0]}, Control API "
                         f"{ports[1]}) answered after {time.monotonic() - started:.1f} s; its log: {log}"]


def pin(home: Path, port: int) -> Path:
    """Make the SuperLink on ``port`` the default connection of ``home``'s Flower configuration (its
    ``config.toml``, replaced), so that ``flwr run`` and ``flwr ls`` use it as they would a deployment's:
    they neither probe the local one (for 0.4 s, which a loaded machine can miss) nor start one. For a
    ``FLWR_HOME`` of a tool's own (a sweep's, a test's), not a user's."""
    path = Path(home) / "config.toml"
    path.write_text(f'[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = "127.0.0.1:{port}"\ninsecure = true\n')
    return path


def status(home: Path, ports: Sequence[int]) -> tuple[int, list[str]]:
    """Exit code 0 and a description when this home's local SuperLink runs, else 1."""
    mine, others = find(home, ports)
    lines = [f"local SuperLink of FLWR_HOME={home}: {p.describe()}" for p in mine]
    lines += [f"  started by it: pid {c}: {' '.join(cmdline(c))}" for p in mine for c in children(p.pid)]
    if not mine:
        lines.append(f"no local SuperLink of FLWR_HOME={home} listens on ports {', '.join(map(str, ports))}")
    lines += [f"not this FLWR_HOME's SuperLink, left alone: {p.describe()}" for p in others]
    return (0 if mine else 1), lines


def stop(home: Path, ports: Sequence[int], timeout: float = 10.0) -> tuple[int, list[str]]:
    """Stop this home's local SuperLink and the runs it started; exit code 1 when one survives."""
    mine, others = find(home, ports)
    lines = [f"not this FLWR_HOME's SuperLink, left alone: {p.describe()}" for p in others]
    if not mine:
        return 0, [f"no local SuperLink of FLWR_HOME={home} listens on ports {', '.join(map(str, ports))}", *lines]
    code = 0
    for link in mine:
        started = {pid: " ".join(cmdline(pid)) for pid in children(link.pid)}  # its executors and runs first
        for pid, what in terminate(list(started), timeout).items():
            lines.append(f"process {pid} started by it ({started[pid]}): {what}")
        what = terminate([link.pid], timeout)[link.pid]
        lines.append(f"local SuperLink {link.describe()}: {what}")
        code = max(code, int(what == STILL_RUNNING))
    return code, lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flower_pfl superlink", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("start", "status", "stop"))
    parser.add_argument("--flwr-home", type=Path, default=None, help="default: $FLWR_HOME, else ~/.flwr")
    parser.add_argument("--port", type=int, action="append", default=None,
                        help="ports to look at (repeatable; default: the local SuperLink's HTTP API and Control API ports)")
    parser.add_argument("--timeout", type=float, default=None,
                        help=f"start: seconds to wait for it to answer (default {START_TIMEOUT:g}); "
                             "stop: seconds between SIGTERM and SIGKILL (default 10)")
    args = parser.parse_args(argv)
    home, ports = args.flwr_home or flwr_home(), args.port or list(local_ports())
    if len(ports) != 2 and args.action == "start":
        parser.error("start takes two ports (--port HTTP_API --port CONTROL_API) or none")
    if args.action == "start":
        try:
            code, lines = 0, start(home, ports, START_TIMEOUT if args.timeout is None else args.timeout)[1]
        except StartError as err:
            code, lines = 1, [str(err)]
    elif args.action == "status":
        code, lines = status(home, ports)
    else:
        code, lines = stop(home, ports, 10.0 if args.timeout is None else args.timeout)
    print("\n".join(lines))
    return code


if __name__ == "__main__":
    sys.exit(main())
