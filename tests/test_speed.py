"""What makes ``flwr run`` fast, and the probe that measures it (``benchmarks/speed.py``)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from flwr.app import Context, RecordDict

from benchmarks import speed, speed_probe
from client_apps.app import Node
from client_apps.flower_internals import in_memory_grid
from flower_pfl.experiment.config import ExperimentConfig
from server_apps.app import PULL_INTERVAL, poll_faster
from server_apps.inprocess import in_process_grid


def _context(partition: int, **overrides) -> Context:
    run_config = {**ExperimentConfig().to_run_config(), **overrides}
    return Context(run_id=1, node_id=100 + partition, node_config={"partition-id": partition, "num-partitions": 4},
                   state=RecordDict(), run_config=run_config)


def test_a_node_reuses_what_does_not_change_between_messages():
    a, b = Node.from_context(_context(0)), Node.from_context(_context(1))
    assert a.cfg is b.cfg and a.model is b.model  # parsed once, one model to load parameters into
    assert a.state is not b.state and a.partition_id == 0 and b.partition_id == 1
    assert not a.data.y_train.equal(b.data.y_train) or not a.data.x_train.equal(b.data.x_train)
    other = Node.from_context(_context(0, model="dnn"))
    assert other.cfg is not a.cfg and other.model is not a.model and other.cfg.model == "dnn"


def test_the_simulation_grid_polls_faster_and_no_other_grid_changes():
    grid_class = in_memory_grid()
    grid = grid_class.__new__(grid_class)
    grid.pull_interval = 0.1  # Flower's default
    poll_faster(grid)
    assert grid.pull_interval == PULL_INTERVAL < 0.1
    grid.pull_interval = 0.001  # already faster: kept
    poll_faster(grid)
    assert grid.pull_interval == 0.001
    other = in_process_grid(speed_probe.clientapp, 2, ExperimentConfig().to_run_config())
    poll_faster(other)
    assert not hasattr(other, "pull_interval")


def _rows() -> list[dict]:
    """Two training exchanges one second apart; the first holds two messages on two actors."""
    return [
        {"row": "exchange", "kind": "train", "start": 10.0, "end": 11.0, "push_messages": 0.1, "pull_messages": 0.05},
        {"row": "exchange", "kind": "train", "start": 12.0, "end": 13.0},
        {"row": "process", "start": 10.2, "end": 10.5, "actors": 2},
        {"row": "process", "start": 10.3, "end": 10.7, "actors": 2},
        {"row": "handler", "kind": "train", "start": 10.25, "end": 10.45, "cpu": 0.1, "setup": 0.01, "train": 0.15},
        {"row": "handler", "kind": "train", "start": 10.35, "end": 10.65, "cpu": 0.2, "load": 0.02, "train": 0.2},
    ]


def test_the_breakdown_adds_up_to_the_round_by_hand():
    result = speed_probe.analyse(_rows(), 1, 1)
    parts = result["parts"]
    assert result["seconds_per_round"] == pytest.approx(2.0)
    expected = {"serverapp": 1.0, "push": 0.1, "dispatch wait": 0.1, "reply wait": 0.3,
                "setup": 0.005, "load": 0.01, "train": 0.175, "reply": (0.5 - 0.38) / 2,
                "ray": (0.7 - 0.5) / 2, "actors idle": 0.5 - 0.7 / 2}
    assert parts == pytest.approx(expected)
    assert sum(parts.values()) == pytest.approx(result["seconds_per_round"])
    assert result["client_cpu_per_round"] == pytest.approx(0.3)
    assert result["pull_per_round"] == pytest.approx(0.05)  # while the actors work: beside the parts
    assert result["ray_ms"] == pytest.approx({"before": 50.0, "after": 50.0})


def test_the_window_needs_its_rounds():
    with pytest.raises(ValueError, match="2 training rounds recorded"):
        speed_probe.analyse(_rows(), 1, 2)


def test_the_timed_app_runs_the_package_with_its_run_config(tmp_path):
    app = speed.timed_app(tmp_path)
    timed = tomllib.loads((app / "pyproject.toml").read_text())
    project = tomllib.loads((speed.PROJECT / "pyproject.toml").read_text())
    assert timed["tool"]["flwr"]["app"]["components"] == {"serverapp": "speed_probe:serverapp",
                                                          "clientapp": "speed_probe:clientapp"}
    assert timed["tool"]["flwr"]["app"]["config"] == project["tool"]["flwr"]["app"]["config"]
    assert (app / "speed_probe.py").read_text() == Path(speed_probe.__file__).read_text()


def test_a_timed_in_process_run_accounts_for_its_rounds(tmp_path, monkeypatch):
    """The probe around the package's real apps: every message and exchange is timed, and the parts of
    a round add up to it."""
    monkeypatch.setenv(speed_probe.TIMINGS, str(tmp_path))
    config = {**ExperimentConfig().to_run_config(), "num-rounds": 4, "eval-every": 2, "clients-per-round": 3,
              "local-steps": 2, "output-dir": str(tmp_path / "results")}
    speed_probe.run_timed(in_process_grid(speed_probe.clientapp, 6, config), config)
    rows = speed_probe.read(tmp_path)
    kinds = {(r["row"], r.get("kind")) for r in rows}
    assert {("handler", "train"), ("handler", "evaluate"), ("handler", "query"), ("exchange", "train"),
            ("exchange", "evaluate"), ("exchange", "query"), ("run", None)} <= kinds
    assert sum(r["row"] == "handler" and r["kind"] == "train" for r in rows) == 4 * 3
    result = speed_probe.analyse(rows, 2, 3)
    assert sum(result["parts"].values()) == pytest.approx(result["seconds_per_round"])
    assert result["parts"]["train"] > 0 and "ray" not in result["parts"]  # in-process: no Ray
