"""`python -m flower_pfl superlink`: finds the local SuperLink by its ports and FLWR_HOME, stops it by PID.

A small Python process stands in for `flower-superlink`: it listens on a free port and carries the
`--log-file <FLWR_HOME>/local-superlink/superlink.log` argument `flwr run` gives the real one.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from deployment import free_port

from flower_pfl.tools import superlink

pytestmark = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads /proc")

FAKE = """
import signal, socket, subprocess, sys, time
if "--ignore-sigterm" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
s = socket.socket()
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]) if "--with-child" in sys.argv else None
print(child.pid if child else 0, flush=True)
time.sleep(600)
"""


@pytest.fixture
def spawn():
    """Start fake SuperLinks; whatever is left is stopped by PID afterwards."""
    started: list[int] = []

    def start(home: Path, port: int, *flags: str) -> tuple[subprocess.Popen, int]:
        log_file = home / "local-superlink" / "superlink.log"
        proc = subprocess.Popen([sys.executable, "-c", FAKE, str(port), "--log-file", str(log_file), *flags],
                                stdout=subprocess.PIPE, text=True)
        child = int(proc.stdout.readline())  # printed once it listens
        started.extend([proc.pid] + ([child] if child else []))
        return proc, child

    yield start
    for pid in started:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _gone(pid: int) -> bool:
    return not superlink._alive(pid)


def test_status_and_stop_find_the_listener_of_this_home_and_stop_it_and_its_children(tmp_path, spawn):
    port, other_port = free_port(), free_port()
    proc, child = spawn(tmp_path, port, "--with-child")
    code, lines = superlink.status(tmp_path, [port, other_port])
    assert code == 0
    assert lines[0].startswith(f"local SuperLink of FLWR_HOME={tmp_path}: pid {proc.pid} (port {port}): ")
    assert lines[1].startswith(f"  started by it: pid {child}: ")

    code, lines = superlink.stop(tmp_path, [port, other_port], timeout=10)
    assert code == 0
    assert lines[0].startswith(f"process {child} started by it (") and lines[0].endswith("): stopped")
    assert lines[1].startswith(f"local SuperLink pid {proc.pid} (port {port}): ") and lines[1].endswith(": stopped")
    assert proc.wait(timeout=10) == -signal.SIGTERM and _gone(child)
    code, lines = superlink.status(tmp_path, [port])
    assert code == 1 and lines == [f"no local SuperLink of FLWR_HOME={tmp_path} listens on ports {port}"]


def test_a_listener_of_another_home_is_left_alone(tmp_path, spawn):
    port = free_port()
    proc, _ = spawn(tmp_path / "theirs", port)
    mine = tmp_path / "mine"
    code, lines = superlink.stop(mine, [port], timeout=1)
    assert code == 0
    assert lines[0] == f"no local SuperLink of FLWR_HOME={mine} listens on ports {port}"
    assert lines[1].startswith(f"not this FLWR_HOME's SuperLink, left alone: pid {proc.pid} (port {port}): ")
    assert proc.poll() is None  # still running
    assert superlink.status(mine, [port])[0] == 1


def test_a_superlink_that_ignores_sigterm_is_killed_after_the_timeout(tmp_path, spawn):
    port = free_port()
    proc, _ = spawn(tmp_path, port, "--ignore-sigterm")
    code, lines = superlink.stop(tmp_path, [port], timeout=0.5)
    assert code == 0 and lines[-1].endswith(": killed (SIGKILL: still running 0.5 s after SIGTERM)")
    assert proc.wait(timeout=10) == -signal.SIGKILL


def test_the_command_line_prints_what_it_found(tmp_path, spawn, capsys):
    port = free_port()
    proc, _ = spawn(tmp_path, port)
    assert superlink.main(["status", "--flwr-home", str(tmp_path), "--port", str(port)]) == 0
    assert f"pid {proc.pid} (port {port})" in capsys.readouterr().out
    assert superlink.main(["stop", "--flwr-home", str(tmp_path), "--port", str(port)]) == 0
    assert capsys.readouterr().out.rstrip().endswith(": stopped")
    assert proc.wait(timeout=10) == -signal.SIGTERM


def test_home_and_ports_come_from_flowers_environment_variables(monkeypatch, tmp_path):
    monkeypatch.setenv("FLWR_HOME", str(tmp_path))
    monkeypatch.setenv("FLWR_LOCAL_SUPERLINK_HTTP_API_PORT", "41001")
    monkeypatch.setenv("FLWR_LOCAL_CONTROL_API_PORT", "41003")
    assert superlink.flwr_home() == tmp_path and superlink.local_ports() == (41001, 41003)
    monkeypatch.delenv("FLWR_HOME")
    monkeypatch.delenv("FLWR_LOCAL_SUPERLINK_HTTP_API_PORT")
    monkeypatch.delenv("FLWR_LOCAL_CONTROL_API_PORT")
    assert superlink.flwr_home() == Path.home() / ".flwr" and superlink.local_ports() == (39091, 39093)


SERVES = """
import http.server, os, sys, time
open(sys.argv[5] + ".path", "w").write(os.environ["PATH"])  # beside its log: the PATH it was started with
time.sleep(float(sys.argv[2]))
if sys.argv[3] == "exit":
    sys.exit(3)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if sys.argv[3] == "answer" else 503)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


@pytest.fixture
def fake_superlink(monkeypatch):
    """``superlink.start`` runs a stand-in that answers its health check after ``delay`` seconds ("answer"),
    never ("refuse") or exits with code 3 ("exit"); it names this home's log file, as the real one does."""
    def use(delay: float, how: str) -> None:
        monkeypatch.setattr(superlink, "command", lambda home, ports: [
            sys.executable, "-c", SERVES, str(ports[0]), str(delay), how, "--log-file", str(superlink.folder(home) / "superlink.log")])
    return use


def test_start_waits_until_the_superlink_answers_and_keeps_one_already_running(tmp_path, fake_superlink):
    fake_superlink(2.0, "answer")
    ports = (free_port(), free_port())
    pid, lines = superlink.start(tmp_path, ports, timeout=60)
    try:
        assert superlink.answers(ports[0]) and re.search(rf"pid {pid} \(port {ports[0]}, .*answered after [2-9]\.\d s", lines[0]), lines
        # the Flower processes it starts by name (flower-superexec) come from this environment, not another on PATH
        path = (superlink.folder(tmp_path.resolve()) / "superlink.log.path").read_text()
        assert path.split(os.pathsep)[0] == str(Path(sys.executable).parent)
        assert superlink.start(tmp_path, ports)[0] == pid  # running: kept, not started twice
        assert superlink.status(tmp_path, ports)[0] == 0
    finally:
        assert superlink.stop(tmp_path, ports, timeout=5)[0] == 0
    assert _gone(pid)


@pytest.mark.parametrize("how,said", [("exit", "exited with code 3 before it answered"), ("refuse", "did not answer within 1 s")])
def test_start_says_why_a_superlink_did_not_come_up_and_leaves_nothing_running(tmp_path, fake_superlink, how, said):
    fake_superlink(0.0, how)
    ports = (free_port(), free_port())
    with pytest.raises(superlink.StartError, match=said) as failed:
        superlink.start(tmp_path, ports, timeout=1)
    assert str(superlink.folder(tmp_path.resolve()) / "superlink.log") in str(failed.value)
    assert not superlink.find(tmp_path, ports)[0]  # stopped, or gone by itself


def test_start_refuses_ports_another_process_holds(tmp_path, spawn):
    port = free_port()
    spawn(tmp_path / "theirs", port)
    with pytest.raises(superlink.StartError, match=f"ports {port}, .* are taken by another process"):
        superlink.start(tmp_path / "mine", (port, free_port()))
