"""``examples/message_app``, a user's own Flower app (``@app.main()``, its own model, data and training
loop) on this package's strategies, run in-process for every method it offers: the ServerApp and
ClientApp code are what ``flwr run`` executes (test_e2e_flwr_run.py runs SCAFFOLD's through Ray)."""

from __future__ import annotations

import json
import logging
import re
import tomllib

import pytest
from conftest import ROOT
from flwr.app import Context, RecordDict

from server_apps.inprocess import in_process_grid

APP = ROOT / "examples" / "message_app"
NODES = 6


@pytest.fixture
def message_app(monkeypatch):
    monkeypatch.syspath_prepend(str(APP))
    from message_app import client_app, server_app

    return client_app.app, server_app.app


@pytest.mark.parametrize("method", ["fedmcsa", "fedacs", "scaffold", "igfl"])
def test_own_message_app_with_each_methods_client_algorithm(message_app, caplog, method):
    """The user's loop with ``algorithm_for`` hooks (FedMCSA's proximal term; SCAFFOLD's correction, whose
    Δc_i travels back in the reply; IGFL-C's Δw_i, kept in the node's state): every round trains all
    six clients, every update and every extra is accepted, and the app logs its accuracy each round."""
    client_app, server_app = message_app
    config = {**tomllib.loads((APP / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"],
              "method": method, "num-rounds": 3, "clients-per-round": NODES}
    grid = in_process_grid(client_app, NODES, config)
    with caplog.at_level(logging.INFO):
        server_app(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=config))
    log = caplog.text
    accuracies = [r.getMessage() for r in caplog.records if r.getMessage().startswith("message-app: round")]
    assert len(accuracies) == 3, log[-3000:]
    counts = re.findall(r"'clients-(accepted|rejected|failed)': '?(\d+)'?", log)
    assert counts and {(kind, int(n)) for kind, n in counts} == {("accepted", NODES), ("rejected", 0), ("failed", 0)}, log[-3000:]
    assert "rejected (" not in log, log[-3000:]


OWN_DATA_APP = ROOT / "examples" / "own_data_app"


def test_own_data_app_runs_the_packages_apps_on_its_own_data_and_model(monkeypatch, tmp_path):
    """examples/own_data_app names its data and model by import path: one machine per client (the natural
    partition of its client ids), its 1-D CNN with its head named. FedAvg pools what eight machines learn and
    beats each machine alone (Local), as it should on data that only differ by gain and noise."""
    from server_apps.inprocess import run_in_process

    monkeypatch.syspath_prepend(str(OWN_DATA_APP))
    config = {**tomllib.loads((OWN_DATA_APP / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"], "figures": False}
    summaries = {}
    for method in ("fedavg", "local"):
        folder = run_in_process({**config, "method": method, "output-dir": str(tmp_path / method)}, num_clients=8)
        summaries[method] = json.loads((folder / "summary.json").read_text())
        assert summaries[method]["status"] == "completed" and folder.name.startswith(f"{method}-vibrations-build-seed0")
    assert summaries["fedavg"]["client_groups"] == {str(i): f"machine{i}" for i in range(8)}
    assert summaries["fedavg"]["bmta"] > summaries["local"]["bmta"] + 0.2  # observed 0.866 against 0.400
