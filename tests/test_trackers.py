"""Live trackers: what TensorBoard and MLflow hold, read back with their own readers, is what the
results folder holds (``metrics.jsonl``, ``clients.jsonl``, ``summary.json``); a resumed run continues
the same tracker runs without a step twice; sweeps group their cells; strategies in users' apps track
themselves; a missing package names its extra. (A real SIGKILL and resume under ``flwr run``:
``tests/test_e2e_flwr_run.py``.)"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from collections import Counter
from collections.abc import Collection
from pathlib import Path

import fabricate as fb
import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord
from flwr.common import Code, EvaluateRes, Status
from test_twins import NODES, _model

import strategies
import strategies.message
from flower_pfl.engine import extras
from flower_pfl.engine.extras import MissingExtra
from flower_pfl.experiment.config import ConfigError, ExperimentConfig
from flower_pfl.run.trackers import STATE, RunTrackers, TrackerSettings
from flower_pfl.tools import sweep as sweep_tool
from flower_pfl.tools.sweep_grid import Sweep, parse_set
from server_apps.inprocess import run_in_process

# --- the trackers' own readers --------------------------------------------------------------------

def tensorboard_events(folder: Path) -> dict:
    """``{"scalars": {tag: [(step, value)]}, "histograms": {tag: [(step, count)]}, "images": [tag], "tensors": [tag]}``,
    read by TensorBoard's event reader (which applies a resumed writer's purge)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "histograms": 0, "images": 0, "tensors": 0})
    acc.Reload()
    tags = acc.Tags()
    return {"scalars": {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in tags["scalars"]},
            "histograms": {t: [(e.step, e.histogram_value.num) for e in acc.Histograms(t)] for t in tags["histograms"]},
            "images": tags["images"], "tensors": tags["tensors"]}


def mlflow_run(folder: Path):
    """The MLflow client, and the run that ``trackers.json`` in ``folder`` names."""
    from mlflow.tracking import MlflowClient

    state = json.loads((folder / STATE).read_text())["mlflow"]
    client = MlflowClient(tracking_uri=state["uri"])
    return client, client.get_run(state["run_id"])


def mlflow_series(client, run) -> dict[str, list[tuple[int, float]]]:
    return {key: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)) for key in run.data.metrics}


def expected_series(run_dir: Path, leave_out: Collection[str] = ()) -> dict[str, list[tuple[int, float]]]:
    """What ``metrics.jsonl`` says each tracker series must hold (but the keys ``leave_out``)."""
    out: dict[str, list[tuple[int, float]]] = {}
    for row in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()):
        for key, value in row.items():
            if key not in ("round", "phase", "elapsed_s", *leave_out) and isinstance(value, int | float):
                out.setdefault(f"{row['phase']}/{key}", []).append((row["round"], float(value)))
    return out


def assert_series_match(actual: dict, expected: dict, float32: bool = False) -> None:
    """The tracker holds ``metrics.jsonl``'s numbers: the same values written twice, so exactly,
    after TensorBoard's rounding to float32 (``float32``; MLflow keeps float64)."""
    for key, series in expected.items():
        assert key in actual, f"{key} is not in the tracker"
        assert [s for s, _ in actual[key]] == [s for s, _ in series], key
        assert [v for _, v in actual[key]] == [float(np.float32(v)) if float32 else v for _, v in series], key


# --- a run of the package's ServerApp --------------------------------------------------------------

RUN = {"method": "fedmcsa", "num-rounds": 4, "clients-per-round": 3, "eval-every": 2, "local-steps": 5}


def test_a_runs_trackers_hold_what_its_results_folder_holds(tmp_path):
    run_dir = run_in_process({**RUN, "output-dir": str(tmp_path), "tracker": "tensorboard,mlflow"}, num_clients=6)
    expected = expected_series(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    clients = Counter(json.loads(line)["round"] for line in (run_dir / "clients.jsonl").read_text().splitlines())
    assert {"train/train-loss", "train/clients-accepted", "evaluate/accuracy-mean", "evaluate/accuracy-std"} <= set(expected)

    tb = tensorboard_events(run_dir / "tensorboard")
    assert_series_match(tb["scalars"], expected, float32=True)
    assert [s for s, _ in tb["scalars"]["time/round-s"]] == [1, 2, 3, 4]
    assert tb["histograms"]["evaluate/client-accuracy"] == [(r, float(n)) for r, n in sorted(clients.items())]
    assert tb["scalars"]["summary/bmta"] == [(0, float(np.float32(summary["bmta"])))]
    assert "figures/learning_curve" in tb["images"] and "config/text_summary" in tb["tensors"]

    client, run = mlflow_run(run_dir)
    series = mlflow_series(client, run)
    assert_series_match(series, expected)
    assert series["summary/bmta"] == [(0, summary["bmta"])]
    accuracies = [json.loads(line)["accuracy"] for line in (run_dir / "clients.jsonl").read_text().splitlines()
                  if json.loads(line)["round"] == 4]
    assert series["evaluate/client-accuracy-p50"][-1] == (4, pytest.approx(float(np.median(accuracies))))
    assert run.data.params["method"] == "fedmcsa" and run.data.params["fedmcsa-sigma"] == "50.0"
    assert run.info.status == "FINISHED" and run.info.run_name == run_dir.name
    assert "figures/learning_curve.png" in {f.path for f in client.list_artifacts(run.info.run_id, "figures")}
    assert Path(client.get_experiment(run.info.experiment_id).artifact_location.removeprefix("file://")).parent == tmp_path


def test_a_resumed_run_continues_the_same_tracker_runs_without_a_step_twice(tmp_path):
    """The first process logged rounds 1-5 and died (no close) after checkpointing round 3; the resumed one
    logs rounds 4-6 again, with the same numbers, as an exact resume does."""
    settings = TrackerSettings(("tensorboard", "mlflow"), uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    folder = tmp_path / "run"

    def rounds(trackers: RunTrackers, which: range) -> None:
        for r in which:
            trackers.on_train(r, {"train-loss": 1.0 / r, "clients-accepted": 3}, 0.5)
            trackers.on_evaluate(r, {"accuracy-mean": r / 10})
            trackers.on_client_accuracies(r, [r / 10, r / 20])

    rounds(RunTrackers(settings, folder, "run", {"method": "fedavg"}), range(1, 6))
    first = json.loads((folder / STATE).read_text())
    resumed = RunTrackers(settings, folder, "run", {"method": "fedavg"}, resume_after=3)
    rounds(resumed, range(4, 7))
    resumed.finish({"bmta": 0.6})
    assert json.loads((folder / STATE).read_text())["mlflow"]["run_id"] == first["mlflow"]["run_id"]

    expected = {"train/train-loss": [(r, 1.0 / r) for r in range(1, 7)], "evaluate/accuracy-mean": [(r, r / 10) for r in range(1, 7)],
                "train/clients-accepted": [(r, 3.0) for r in range(1, 7)]}
    tb = tensorboard_events(folder / "tensorboard")
    assert_series_match(tb["scalars"], expected, float32=True)
    assert [s for s, _ in tb["histograms"]["evaluate/client-accuracy"]] == [1, 2, 3, 4, 5, 6]
    client, run = mlflow_run(folder)
    assert_series_match(mlflow_series(client, run), expected)
    assert [s for s, _ in mlflow_series(client, run)["evaluate/client-accuracy-p50"]] == [1, 2, 3, 4, 5, 6]
    assert len(client.search_runs([run.info.experiment_id])) == 1 and run.info.status == "FINISHED"


def test_wandb_runs_offline_and_a_resumed_run_reuses_its_id_and_skips_logged_steps(tmp_path, monkeypatch):
    """W&B itself is not installed for the tests: a stand-in module records the calls."""
    calls: list[tuple] = []

    class Run:
        def __init__(self, **kwargs):
            calls.append(("init", kwargs))
            self.config, self.summary = types.SimpleNamespace(update=lambda *a, **k: calls.append(("config", a[0]))), {}

        def log(self, values, step=None):
            calls.append(("log", step, sorted(values)))

        def finish(self, exit_code=0):
            calls.append(("finish", exit_code))

    fake = types.SimpleNamespace(init=lambda **kwargs: Run(**kwargs), Histogram=lambda values, num_bins: ("hist", len(values)),
                                 Image=lambda path: path)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.setattr(extras.importlib.util, "find_spec", lambda name, *a: object() if name == "wandb" else importlib.util.find_spec(name, *a))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    settings = TrackerSettings(("wandb",), experiment="sweep-1", group="iid")
    first = RunTrackers(settings, tmp_path / "run", "run", {"lr": 0.1})
    for r in (1, 2, 3):
        first.on_train(r, {"train-loss": 0.5})
    init = calls[0][1]
    assert init["mode"] == "offline" and init["project"] == "sweep-1" and init["group"] == "iid" and init["resume"] == "allow"
    assert ("config", {"lr": 0.1, "group": "iid"}) in calls
    calls.clear()
    resumed = RunTrackers(settings, tmp_path / "run", "run", {"lr": 0.1}, resume_after=2)
    for r in (3, 4):
        resumed.on_train(r, {"train-loss": 0.5})
    resumed.finish({"bmta": 0.5})
    assert calls[0][1]["id"] == init["id"] and not any(c[0] == "config" for c in calls)
    assert [c[1] for c in calls if c[0] == "log" and c[1] is not None] == [4]  # 3 was logged before the crash
    assert calls[-1] == ("finish", 0)


# --- bad input -------------------------------------------------------------------------------------

def test_an_unknown_tracker_is_refused_naming_the_choices():
    with pytest.raises(ConfigError, match=r"'tracker' = 'tensorbord' is invalid: must be '' or one or more of tensorboard, mlflow, wandb"):
        ExperimentConfig.from_mapping({"tracker": "tensorbord"})
    with pytest.raises(ValueError, match="unknown tracker 'tb'"):
        strategies.message.FedMCSA(tracker="tb")


def test_a_missing_tracker_package_stops_the_run_at_start_naming_the_extra(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(extras.importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    with pytest.raises(MissingExtra, match=r"tracker 'mlflow'.*pip install 'flower-pfl\[mlflow\]'"):
        run_in_process({**RUN, "output-dir": str(tmp_path), "tracker": "mlflow"}, num_clients=3)
    assert not list(tmp_path.iterdir())  # nothing written
    with pytest.raises(MissingExtra, match=r"flower-pfl\[mlflow\]"):
        strategies.FedMCSA(tracker=["mlflow"])


# --- sweeps and users' apps ------------------------------------------------------------------------

def test_a_sweep_groups_its_cells_in_one_mlflow_experiment_and_tensorboard_folders(tmp_path):
    sweep = Sweep(methods=["fedavg", "local"], seeds=[0, 1], name="tiny",
                  base={**{k: v for k, v in RUN.items() if k != "method"}, "num-rounds": 2, "num-nodes": 4, "tracker": "tensorboard,mlflow", "checkpoint-every": 0},
                  references=[])
    record = sweep_tool.run(sweep, tmp_path / "tiny", workers=2, progress=False)
    assert all(cell["status"] == "completed" for cell in record["cells"])
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'tiny' / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("tiny").experiment_id])
    assert sorted((r.data.params["method"], r.data.params["seed"], r.data.params["group"]) for r in runs) == [
        ("fedavg", "0", "base"), ("fedavg", "1", "base"), ("local", "0", "base"), ("local", "1", "base")]
    for cell in record["cells"]:
        events = tensorboard_events(tmp_path / "tiny" / cell["results_dir"] / "tensorboard")
        assert [s for s, _ in events["scalars"]["evaluate/accuracy-mean"]] == [1, 2]


def test_the_sweep_command_line_takes_several_trackers_as_one_value():
    assert parse_set(["tracker=tensorboard,mlflow", "lr=0.1,0.2"]) == ({"tracker": "tensorboard,mlflow"}, {"lr": [0.1, 0.2]})


@pytest.mark.parametrize("api", ["message", "legacy"])
def test_a_strategy_in_a_users_app_tracks_its_rounds(tmp_path, api):
    """Rounds driven with fabricated replies; ``finish`` is what the Message API's ``start`` calls at its end."""
    fb.set_task_identity()
    initial = {k: v.numpy() for k, v in _model().state_dict().items()}
    accuracies = {1: [0.5, 0.7, 0.9], 2: [0.6, 0.8, 1.0]}
    if api == "message":
        strategy = strategies.message.FedMCSA(clients_per_round=3, min_available_nodes=1, tracker="tensorboard", tracker_dir=str(tmp_path))
        arrays = ArrayRecord({k: torch.as_tensor(v) for k, v in initial.items()})
        for r in (1, 2):
            msgs = list(strategy.configure_train(r, arrays, ConfigRecord({}), fb.FakeGrid(NODES)))
            strategy.aggregate_train(r, [fb.train_reply(m, {k: v + 0.01 * r for k, v in initial.items()}) for m in msgs])
            msgs = list(strategy.configure_evaluate(r, arrays, ConfigRecord({}), fb.FakeGrid(NODES)))[:3]
            strategy.aggregate_evaluate(r, [fb.eval_reply(m, a, 10) for m, a in zip(msgs, accuracies[r])])
    else:
        strategy = strategies.FedMCSA(clients_per_round=3, initial_parameters=initial, min_available_clients=1,
                                      fraction_evaluate=0.6, tracker="tensorboard", tracker_dir=str(tmp_path))
        manager = fb.client_manager([str(n) for n in NODES])
        for r in (1, 2):
            fits = strategy.configure_fit(r, strategy.initial_parameters, manager)
            strategy.aggregate_fit(r, [(proxy, fb.fit_res([v + 0.01 * r for v in initial.values()])) for proxy, _ in fits], [])
            evals = strategy.configure_evaluate(r, strategy.initial_parameters, manager)
            strategy.aggregate_evaluate(r, [(proxy, EvaluateRes(Status(Code.OK, ""), 1.0, 10, {"accuracy": a}))
                                            for (proxy, _), a in zip(evals, accuracies[r])], [])
    strategy.tracking.finish()
    [folder] = tmp_path.glob("FedMCSA-*")
    events = tensorboard_events(folder / "tensorboard")
    assert events["scalars"]["train/clients-accepted"] == [(1, 3.0), (2, 3.0)]
    assert events["scalars"]["evaluate/accuracy-mean"] == [(1, pytest.approx(0.7)), (2, pytest.approx(0.8))]
    assert events["histograms"]["evaluate/client-accuracy"] == [(1, 3.0), (2, 3.0)]
    assert events["scalars"]["summary/bmta"] == [(0, pytest.approx(0.8))]
