"""Live trackers of a run: TensorBoard, MLflow and Weights & Biases.

``RunTrackers`` receives what the results folder receives (``flower_pfl.run.results.RunRecorder``)
and hands it to every tracker the run asked for (run-config ``tracker``, or a strategy's
``tracker`` argument):

* per training round, every aggregated metric as ``train/<name>`` (training loss, reply counts and
  refusals) and the round's time as ``time/round-s``;
* per evaluation, every aggregated metric as ``evaluate/<name>`` (the personalized summary
  ``<key>-mean/std/min/...`` among them) and the clients' accuracies as a histogram
  (MLflow, which has none: their 10/25/50/75/90 % quantiles as metrics, the histogram as a JSON artifact);
* the run config as hyperparameters, and at the end the summary (``summary/<name>``) and the run's
  figures (learning curve, attention and similarity heatmaps) as images.

The step is the round. Everything is written to local files unless the user says otherwise:
TensorBoard to ``<results>/tensorboard``, MLflow to a SQLite store (``tracker-uri``; by default
``mlflow.db`` next to the results folder), W&B offline into ``<results>/wandb`` unless the user
has logged in (or set ``WANDB_MODE``). A resumed run continues the same tracker runs
(``trackers.json`` in the results folder holds their ids): TensorBoard purges the events after the
round resumed from, MLflow and W&B skip the steps they already hold (the resumed run recomputes
exactly those numbers), so no step appears twice.
"""

from __future__ import annotations

import json
import os
import secrets
import struct
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from flower_pfl.engine.extras import require
from flower_pfl.experiment.config import parse_trackers

#: in a results folder: the trackers' run ids and steps, for a resumed run
STATE = "trackers.json"
#: the clients' accuracy quantiles logged where a tracker has no histogram (MLflow)
QUANTILES: tuple[int, ...] = (10, 25, 50, 75, 90)
HISTOGRAM_BINS = np.linspace(0.0, 1.0, 21)


def require_trackers(names: Iterable[str]) -> None:
    """Stop at start-up, naming the extra to install, when a tracker's package (named as the tracker) is missing."""
    for name in names:
        require(name, why=f"tracker '{name}'")


@dataclass(frozen=True)
class TrackerSettings:
    """Which trackers, and where they group a run.

    ``experiment``: MLflow's experiment and W&B's project (a sweep: its name). ``uri``: MLflow's tracking
    URI (``""``: ``sqlite:///<parent of the results folder>/mlflow.db``). ``group``: a label that groups runs
    (a sweep's setting), an MLflow tag and parameter and W&B's group."""

    names: tuple[str, ...] = ()
    experiment: str = "flower-pfl"
    uri: str = ""
    group: str = ""


class Tracker:
    """One tracker's writer. ``skip(key, step)`` says a resumed run's tracker already holds that step."""

    def params(self, config: Mapping[str, Any]) -> None: ...
    def scalars(self, step: int, values: Mapping[str, float]) -> None: ...
    def histogram(self, step: int, tag: str, values: np.ndarray) -> None: ...
    def images(self, step: int, paths: Sequence[Path]) -> None: ...
    def summary(self, values: Mapping[str, Any]) -> None: ...
    def close(self, failed: bool = False) -> None: ...
    def state(self) -> dict[str, Any]:
        return {}


def _png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's header."""
    width, height = struct.unpack(">II", data[16:24])
    return int(width), int(height)


class TensorBoardTracker(Tracker):
    """Event files in ``<folder>/tensorboard``; a resumed run purges the events after its round."""

    def __init__(self, folder: Path, resume_after: int | None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        purge = resume_after + 1 if resume_after is not None else None
        self.writer = SummaryWriter(log_dir=str(folder / "tensorboard"), purge_step=purge)

    def params(self, config: Mapping[str, Any]) -> None:
        from torch.utils.tensorboard.summary import hparams

        plain = {k: v if isinstance(v, int | float | str | bool) else json.dumps(v) for k, v in config.items()}
        writer = self.writer._get_file_writer()
        for summary in hparams(plain, {"summary/bmta": 0.0, "evaluate/accuracy-mean": 0.0}):
            writer.add_summary(summary)
        rows = "\n".join(f"| {k} | {v} |" for k, v in sorted(plain.items()))
        self.writer.add_text("config", "| key | value |\n|---|---|\n" + rows, 0)

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def histogram(self, step: int, tag: str, values: np.ndarray) -> None:
        self.writer.add_histogram(tag, values, step, bins=HISTOGRAM_BINS)

    def images(self, step: int, paths: Sequence[Path]) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary

        for path in paths:
            data = path.read_bytes()
            width, height = _png_size(data)
            image = Summary.Image(height=height, width=width, colorspace=4, encoded_image_string=data)
            self.writer._get_file_writer().add_summary(Summary(value=[Summary.Value(tag=f"figures/{path.stem}", image=image)]), step)

    def summary(self, values: Mapping[str, Any]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(f"summary/{key}", value, 0)

    def close(self, failed: bool = False) -> None:
        self.writer.close()


class MLflowTracker(Tracker):
    """A run in an MLflow experiment (``MlflowClient``: no global state, so several runs can share a
    process). Resumed: the same run id, and the steps each metric already holds are skipped."""

    def __init__(self, settings: TrackerSettings, folder: Path, run_name: str, previous: Mapping[str, Any]) -> None:
        from mlflow.tracking import MlflowClient

        self.uri = previous.get("uri") or settings.uri or f"sqlite:///{folder.parent.resolve() / 'mlflow.db'}"
        self.client = MlflowClient(tracking_uri=self.uri)
        self.last_steps: dict[str, int] = {}
        if previous.get("run_id"):
            self.run_id = previous["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
            for key in self.client.get_run(self.run_id).data.metrics:
                self.last_steps[key] = max(m.step for m in self.client.get_metric_history(self.run_id, key))
        else:
            experiment = experiment_id(self.client, settings.experiment, self.uri)
            tags = {"mlflow.runName": run_name, "results-folder": str(folder.resolve())}
            if settings.group:
                tags["group"] = settings.group
            self.run_id = self.client.create_run(experiment, run_name=run_name, tags=tags).info.run_id

    def state(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "uri": self.uri}

    def params(self, config: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        params = [Param(k, v if isinstance(v, str) else json.dumps(v)) for k, v in sorted(config.items())]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 parameters per batch
            self.client.log_batch(self.run_id, params=params[i:i + 100])

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, float(v), now, step) for k, v in values.items() if step > self.last_steps.get(k, -1)]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def histogram(self, step: int, tag: str, values: np.ndarray) -> None:
        self.scalars(step, {f"{tag}-p{q}": float(np.percentile(values, q)) for q in QUANTILES})
        counts, edges = np.histogram(values, bins=HISTOGRAM_BINS)
        self.client.log_dict(self.run_id, {"round": step, "edges": edges.tolist(), "counts": counts.tolist(),
                                           "values": np.asarray(values).tolist()}, f"{tag}/round-{step:05d}.json")

    def images(self, step: int, paths: Sequence[Path]) -> None:
        for path in paths:
            self.client.log_artifact(self.run_id, str(path), "figures")

    def summary(self, values: Mapping[str, Any]) -> None:
        self.scalars(0, {f"summary/{k}": v for k, v in values.items()})

    def close(self, failed: bool = False) -> None:
        self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")


def experiment_id(client: Any, name: str, uri: str) -> str:
    """The id of MLflow experiment ``name``, created if missing (two processes may race to create it); with a
    SQLite store its artifacts go to ``mlartifacts`` beside the database (MLflow's default is the current folder)."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        return str(found.experiment_id)
    location = (Path(uri.removeprefix("sqlite:///")).parent / "mlartifacts").resolve().as_uri() if uri.startswith("sqlite:///") else None
    try:
        # a training experiment (MLflow 3's UI opens other experiments on its GenAI pages)
        return str(client.create_experiment(name, artifact_location=location, tags={"mlflow.experimentKind": "custom_model_development"}))
    except Exception:  # created by another process meanwhile
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return str(found.experiment_id)


def prepare_trackers(run_configs: Iterable[Mapping[str, Any]]) -> None:
    """Before runs start side by side (a sweep's cells): check the trackers' extras, and create each MLflow
    store and experiment once, so that parallel runs do not race to create the same database."""
    configs = list(run_configs)
    require_trackers(sorted({n for c in configs for n in parse_trackers(str(c.get("tracker", "")))}))
    for uri, experiment in sorted({(c["tracker-uri"], c["tracker-experiment"]) for c in configs
                                   if "mlflow" in parse_trackers(str(c.get("tracker", ""))) and c.get("tracker-uri")}):
        from mlflow.tracking import MlflowClient

        experiment_id(MlflowClient(tracking_uri=uri), experiment, uri)


class WandbTracker(Tracker):
    """A W&B run, offline (files in ``<folder>/wandb``, ``wandb sync`` uploads them) unless the user
    has logged in or set ``WANDB_MODE``. Resumed: the same run id; steps up to the last one logged are skipped."""

    def __init__(self, settings: TrackerSettings, folder: Path, run_name: str, previous: Mapping[str, Any]) -> None:
        import wandb

        logged_in = bool(os.environ.get("WANDB_API_KEY")) or "api.wandb.ai" in _netrc()
        mode: Any = os.environ.get("WANDB_MODE") or ("online" if logged_in else "offline")
        self.run_id = previous.get("run_id") or secrets.token_hex(4)
        self.last_step = self.resumed_through = int(previous.get("last_step", -1))
        self.wandb = wandb
        self.run = wandb.init(project=settings.experiment, name=run_name, group=settings.group or None, id=self.run_id,
                              resume="allow", dir=str(folder), mode=mode)

    def state(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "last_step": self.last_step}

    def params(self, config: Mapping[str, Any]) -> None:
        self.run.config.update(dict(config), allow_val_change=True)

    def _log(self, step: int, values: Mapping[str, Any]) -> None:
        if step > self.resumed_through:
            self.run.log(dict(values), step=step)
            self.last_step = max(self.last_step, step)

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        self._log(step, values)

    def histogram(self, step: int, tag: str, values: np.ndarray) -> None:
        self._log(step, {tag: self.wandb.Histogram(np.asarray(values).tolist(), num_bins=len(HISTOGRAM_BINS) - 1)})

    def images(self, step: int, paths: Sequence[Path]) -> None:
        self.run.log({f"figures/{p.stem}": self.wandb.Image(str(p)) for p in paths})

    def summary(self, values: Mapping[str, Any]) -> None:
        self.run.summary.update({f"summary/{k}": v for k, v in values.items()})

    def close(self, failed: bool = False) -> None:
        self.run.finish(exit_code=1 if failed else 0)


def _netrc() -> str:
    path = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        return path.read_text()
    except OSError:
        return ""


class RunTrackers:
    """Every tracker a run writes to, fed as the run goes (see the module docstring).

    ``folder``: the run's results folder (TensorBoard's and W&B's files, ``trackers.json``);
    ``resume_after``: the round a resumed run continues after (``None``: a new run)."""

    def __init__(self, settings: TrackerSettings, folder: str | Path, run_name: str, config: Mapping[str, Any],
                 resume_after: int | None = None) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        require_trackers(settings.names)
        previous = json.loads((self.folder / STATE).read_text()) if resume_after is not None and (self.folder / STATE).exists() else {}
        self.trackers: dict[str, Tracker] = {}
        for name in settings.names:
            if name == "tensorboard":
                self.trackers[name] = TensorBoardTracker(self.folder, resume_after)
            elif name == "mlflow":
                self.trackers[name] = MLflowTracker(settings, self.folder, run_name, previous.get(name, {}))
            else:
                self.trackers[name] = WandbTracker(settings, self.folder, run_name, previous.get(name, {}))
        self._save_state()
        values = {**config, **({"group": settings.group} if settings.group else {})}
        for name, tracker in self.trackers.items():
            if name not in previous:  # a new tracker run (a resumed one has its parameters)
                tracker.params(values)

    def _save_state(self) -> None:
        tmp = self.folder / (STATE + ".tmp")
        tmp.write_text(json.dumps({name: t.state() for name, t in self.trackers.items()}, indent=2))
        tmp.replace(self.folder / STATE)

    def _scalars(self, step: int, values: Mapping[str, float]) -> None:
        for tracker in self.trackers.values():
            tracker.scalars(step, values)
        if "wandb" in self.trackers:  # its last step, for a resumed run
            self._save_state()

    def on_train(self, server_round: int, metrics: Mapping[str, Any], round_seconds: float | None = None) -> None:
        values = {f"train/{k}": float(v) for k, v in metrics.items() if _number(v)}
        if round_seconds is not None:
            values["time/round-s"] = round_seconds
        self._scalars(server_round, values)

    def on_evaluate(self, server_round: int, metrics: Mapping[str, Any]) -> None:
        self._scalars(server_round, {f"evaluate/{k}": float(v) for k, v in metrics.items() if _number(v)})

    def on_client_accuracies(self, server_round: int, accuracies: Sequence[float], tag: str = "evaluate/client-accuracy") -> None:
        values = np.asarray([a for a in accuracies if np.isfinite(a)], dtype=np.float64)
        if values.size:
            for tracker in self.trackers.values():
                tracker.histogram(server_round, tag, values)

    def finish(self, summary: Mapping[str, Any], figures: Sequence[Path] = (), step: int = 0, failed: bool = False) -> None:
        """The summary's numbers and the figures, then every tracker closed."""
        numbers = {k: float(v) for k, v in summary.items() if _number(v)}
        for tracker in self.trackers.values():
            tracker.summary(numbers)
            if figures:
                tracker.images(step, list(figures))
            tracker.close(failed)
        self._save_state()


def _number(value: Any) -> bool:
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool) and np.isfinite(value)
