"""Optional parts: without the module an extra installs, the package stops with the extra to install
(image data sets, the command-line tools), or, for a run's figures, writes its results without them
and says so."""

from __future__ import annotations

import importlib.util
import json

import pytest

from flower_pfl.engine import extras
from flower_pfl.engine.extras import MissingExtra, require
from flower_pfl.experiment.build import load_client_data
from flower_pfl.experiment.config import ExperimentConfig
from flower_pfl.run.results import CURVE, RunRecorder


@pytest.fixture
def without(monkeypatch):
    """Make ``find_spec`` report the given top-level modules as not installed."""
    def hide(*names: str) -> None:
        real = importlib.util.find_spec
        monkeypatch.setattr(extras.importlib.util, "find_spec", lambda name, *a: None if name in names else real(name, *a))
    return hide


def test_a_missing_module_names_its_extra(without):
    without("matplotlib", "torchvision")
    with pytest.raises(MissingExtra, match=r"matplotlib is not installed \(figures\): pip install 'flower-pfl\[plots\]'"):
        require("matplotlib", why="figures")
    with pytest.raises(MissingExtra, match=r"torchvision is not installed \(dataset = 'fmnist'\).*\[data\]"):
        load_client_data(ExperimentConfig(dataset="fmnist", partition="iid", data_dir="/nowhere"), 0, 2)
    require("numpy")  # installed: nothing said


def test_every_optional_module_has_an_extra_declared_in_pyproject():
    import tomllib
    from pathlib import Path

    declared = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(extras.EXTRAS.values()) <= set(declared), sorted(set(extras.EXTRAS.values()) - set(declared))


def test_a_run_without_matplotlib_writes_its_results_without_the_learning_curve(tmp_path, without):
    without("matplotlib")
    lines: list[str] = []
    recorder = RunRecorder(tmp_path, {"method": "fedavg"}, num_rounds=1, log=lines.append)
    recorder.on_evaluate(1, {"accuracy-mean": 0.5, "accuracy": 0.5, "accuracy-std": 0.0})
    summary = recorder.finish(title="t")
    assert summary["status"] == "completed" and json.loads((tmp_path / "summary.json").read_text())["bmta"] == 0.5
    assert not (tmp_path / CURVE).exists() and any("not drawn" in line and "[plots]" in line for line in lines)
