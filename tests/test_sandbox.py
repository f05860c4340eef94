"""Tests write only under temporary folders (conftest.py): a run that persists client state with no
folder given writes it into the test process's sandbox, never into the home folder of whoever runs the suite."""

from __future__ import annotations

from pathlib import Path

from conftest import SANDBOX

from client_apps.persisted_state import state_dir
from server_apps.inprocess import run_in_process


def test_default_folders_lie_in_the_sandbox_and_a_stateful_run_writes_there(tmp_path):
    assert Path.home().is_relative_to(SANDBOX) and state_dir({}).is_relative_to(SANDBOX)
    folder = run_in_process({"method": "scaffold", "num-rounds": 2, "clients-per-round": 2, "eval-every": 2,
                             "output-dir": str(tmp_path)}, num_clients=2)
    (written,) = state_dir({}).glob(folder.name + "-*")  # the results folder's name and a random token
    assert sorted(p.name for p in written.iterdir()) == ["partition-0", "partition-1"]
