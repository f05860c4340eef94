"""The floor benchmark's pieces without ``flwr run`` (``benchmarks/flwr_floor.py``): the minimal Flower app's
handlers and its FedAvg run on the in-process grid, the app folders it writes, and its arithmetic."""

from __future__ import annotations

import importlib
import json
import tomllib
from pathlib import Path

import fabricate as fb
import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.common import MessageType

from benchmarks import flower_floor_app, flwr_floor, speed
from server_apps.inprocess import in_process_grid


def _context(record: Path | str = "") -> Context:
    return Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config={"record-dir": str(record)})


def _message(kind: str) -> Message:
    fb.set_task_identity()
    content = RecordDict({"arrays": flower_floor_app.initial_arrays(), "config": ConfigRecord({"server-round": 1})})
    return Message(content=content, dst_node_id=7, message_type=kind)


def test_the_floor_clientapp_answers_at_once_with_what_it_received(tmp_path):
    sent = _message(MessageType.TRAIN)
    reply = flower_floor_app.train(sent, _context(tmp_path))
    arrays = reply.content.array_records["arrays"]
    assert isinstance(arrays, ArrayRecord) and [a.shape for a in arrays.to_numpy_ndarrays()] == [(10, 60), (10,)]
    assert all(np.array_equal(a, b) for a, b in zip(arrays.to_numpy_ndarrays(), sent.content.array_records["arrays"].to_numpy_ndarrays()))
    assert reply.content.metric_records["metrics"]["num-examples"] == 1
    evaluated = flower_floor_app.evaluate(_message(MessageType.EVALUATE), _context(tmp_path))
    assert not evaluated.content.array_records and evaluated.content.metric_records["metrics"]["num-examples"] == 1
    (noted,) = tmp_path.glob("*.jsonl")
    assert [json.loads(line)["kind"] for line in noted.read_text().splitlines()] == ["train", "evaluate"]
    flower_floor_app.train(sent, _context())  # no record-dir: nothing written, nothing fails


@pytest.mark.parametrize("fraction, evaluations", [(0.0, 0), (1.0, 2 * 3)])
def test_flowers_fedavg_runs_the_floor_app_and_records_each_round(tmp_path, fraction, evaluations):
    config = {"num-rounds": 3, "fraction-evaluate": fraction, "pull-interval": 0.01, "record-dir": str(tmp_path)}
    ends = flower_floor_app.run(in_process_grid(flower_floor_app.clientapp, 2, config), config)  # type: ignore[arg-type]
    assert len(ends) == 4 and ends == sorted(ends)  # before round 1, then after each round
    server = json.loads((tmp_path / "server.json").read_text())
    assert server["ends"] == ends and server["nodes"] == 2 and server["pull_interval"] is None  # the in-process grid has none
    kinds = [json.loads(line)["kind"] for path in tmp_path.glob("*.jsonl") for line in path.read_text().splitlines()]
    assert kinds.count("train") == 2 * 3 and kinds.count("evaluate") == evaluations


def test_the_floor_app_folder_runs_the_floor_module(tmp_path):
    app = flwr_floor.floor_app(tmp_path)
    project = tomllib.loads((app / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    assert project["components"] == {"serverapp": "flower_floor_app:serverapp", "clientapp": "flower_floor_app:clientapp"}
    assert {"num-rounds", "fraction-evaluate", "pull-interval", "record-dir", "client-state-dir"} <= set(project["config"])
    assert (app / "flower_floor_app.py").read_text() == Path(flower_floor_app.__file__).read_text()


def test_the_written_data_app_runs_the_package_with_its_own_handlers(tmp_path, monkeypatch):
    cifar = pytest.importorskip("torchvision.datasets.cifar")
    monkeypatch.setattr(cifar, "check_integrity", cifar.check_integrity)  # the module lifts it on import: put back after
    written_data_app = importlib.import_module("benchmarks.written_data_app")
    app = speed.module_app(tmp_path / "app", Path(written_data_app.__file__))
    components = tomllib.loads((app / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["components"]
    assert components == {"serverapp": "written_data_app:serverapp", "clientapp": "written_data_app:clientapp"}
    for handler in (written_data_app.train, written_data_app.evaluate, written_data_app.query):
        assert handler.__module__ == written_data_app.__name__  # what Ray's pickle imports in an actor
    (tmp_path / "file").write_bytes(b"")
    assert written_data_app.exists(str(tmp_path / "file"), "no such md5") and not written_data_app.exists(str(tmp_path / "none"))


def test_steady_rounds_and_the_schedules_floor():
    assert flwr_floor.steady({0: 0.0, 1: 1.0, 2: 1.5, 3: 2.5}, 2, 3) == pytest.approx(0.75)
    assert flwr_floor.schedule_floor(0.1, 0.2, every=5) == pytest.approx(0.12)
