"""What every test process shares.

- Tests write only under temporary folders: each test process (each pytest-xdist worker too) gets a
  sandbox folder that stands in for the home folder and every cache a run may fill (the clients'
  persisted state, Hugging Face, matplotlib, Ray's session files); it is removed at the end.
- One PyTorch thread per process: pytest-xdist runs several test processes on few cores, and an
  in-process run then computes exactly what a ``flwr run`` client (one CPU per virtual client) does.
- When the session is interrupted (``.ci/run``'s overall time limit sends SIGINT), the tests still
  running are named with how long they have run; a test over its own limit (pytest-timeout) fails
  with the stacks of every thread.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SANDBOX = Path(tempfile.mkdtemp(prefix="fpl-"))  # short: Ray's socket paths live under it
for variable, folder in {"HOME": "home", "XDG_CACHE_HOME": "home/.cache", "HF_HOME": "hf", "MPLCONFIGDIR": "mpl",
                         "FLOWER_PFL_CLIENT_STATE_DIR": "client-state", "RAY_TMPDIR": "ray"}.items():
    (SANDBOX / folder).mkdir(parents=True, exist_ok=True)
    os.environ[variable] = str(SANDBOX / folder)
os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
os.environ["OMP_NUM_THREADS"] = "1"  # processes the tests start (SuperNodes' ClientApps) train on one thread too

import torch  # noqa: E402  (after the environment is set)

torch.set_num_threads(1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """End-to-end tests first: the longest start first, and the short ones fill the gaps."""
    items.sort(key=lambda item: item.get_closest_marker("e2e") is None)


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(SANDBOX, ignore_errors=True)


_running: dict[str, float] = {}


def pytest_runtest_logstart(nodeid: str, location: tuple) -> None:
    _running[nodeid] = time.monotonic()


def pytest_runtest_logfinish(nodeid: str, location: tuple) -> None:
    _running.pop(nodeid, None)


def pytest_keyboard_interrupt(excinfo: pytest.ExceptionInfo) -> None:
    now = time.monotonic()
    lines = [f"  {nodeid} (running for {now - start:.0f} s)" for nodeid, start in sorted(_running.items(), key=lambda x: x[1])]
    print("\nInterrupted while these tests ran:\n" + ("\n".join(lines) if lines else "  none"), file=sys.stderr)
