"""A run's results folder: config, per-round metrics, summary and learning curve."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from flower_pfl.engine.client_metrics import CLIENTS_EVALUATED, NEW_CLIENT_ROW
from flower_pfl.engine.extras import MissingExtra
from flower_pfl.reports.figures import client_accuracies, label_counts, plot_learning_curve, plot_partition
from flower_pfl.run.cost import cost_summary
from flower_pfl.run.progress import no_accuracy_line, progress_line, short_round_note, summary_lines
from flower_pfl.run.summary import summarize_run
from flower_pfl.run.trackers import RunTrackers

logger = logging.getLogger("flower_pfl")

CONFIG, METRICS, SUMMARY, CURVE = "config.json", "metrics.jsonl", "summary.json", "learning_curve.png"
#: each client's training label counts, as the nodes reported them at start (``draw_partition``)
PARTITION = "partition.png"
#: the server's per-client models and what a method learned besides them (safetensors: no code runs on loading)
MODELS, SERVER_STATE = "personalized_models.safetensors", "server_state.safetensors"
#: the run's complete server state after its last checkpointed round (``server_apps.checkpoints``)
CHECKPOINT = "checkpoint.safetensors"
#: one JSON object per client evaluation: ``{"round", "node-id", "partition-id", "accuracy", ...}``
CLIENTS = "clients.jsonl"
#: a client's accuracy in its evaluation row
ACCURACY = "accuracy"
#: an evaluated round's mean client accuracy (``flower_pfl.engine.client_metrics.round_metrics``)
MEAN = "accuracy-mean"
#: every failed client message's full reason, and a simulation's tracebacks (``strategies.failures``)
FAILURES = "failures.log"


@dataclass(frozen=True)
class Coverage:
    """How many clients a round must reach to count: an evaluated round enters the summary's figures
    only when at least ``share`` of the federation's ``clients`` reported an accuracy; a training round
    is *short* when fewer than ``share`` of its sampled clients replied (the others failed)."""

    clients: int = 0
    share: float = 0.0

    @property
    def evaluated(self) -> int:
        """The clients an evaluated round must reach to count."""
        return math.ceil(self.share * self.clients - 1e-9)

    def short_evaluation(self, row: Mapping[str, Any]) -> bool:
        return float(row.get(CLIENTS_EVALUATED, math.inf)) < self.evaluated

    def short_training(self, row: Mapping[str, Any]) -> bool:
        replied = float(row.get("clients-accepted", 0)) + float(row.get("clients-rejected", 0))
        sampled = replied + float(row.get("clients-failed", 0))
        return replied < math.ceil(self.share * sampled - 1e-9)


class FailureAccount(Protocol):
    """What the summary reports of clients that failed (``strategies.failures.NodeFailures``)."""

    def summary(self) -> Mapping[str, Any]: ...


#: fewer test samples than this make a client's accuracy a coarse figure (one sample: 0 or 1)
HANDFUL = 5


def test_set_sizes(clients: Path) -> dict[str, Any]:
    """The evaluated clients' test-set sizes (each client's latest ``num-examples`` in ``clients.jsonl``): the
    summary's ``client_test_samples`` (min, median, max, clients) and ``clients_with_few_test_samples``
    (fewer than ``HANDFUL``); nothing when no client was evaluated."""
    latest: dict[str, int] = {}
    if clients.exists():
        for row in map(json.loads, _complete_lines(clients)):
            if "num-examples" in row:
                latest[str(row.get("partition-id", row.get("node-id")))] = int(row["num-examples"])
    if not latest:
        return {}
    sizes = sorted(latest.values())
    middle = len(sizes) // 2
    median = sizes[middle] if len(sizes) % 2 else (sizes[middle - 1] + sizes[middle]) / 2
    return {"client_test_samples": {"min": sizes[0], "median": median, "max": sizes[-1], "clients": len(sizes)},
            "clients_with_few_test_samples": sum(n < HANDFUL for n in sizes)}


class RunRecorder:
    """Writes results as a run goes, so an interrupted run keeps what it had.

    ``metrics.jsonl`` holds one JSON object per line: ``{"round", "phase", ...}``
    with ``phase`` ``"train"`` or ``"evaluate"``. Evaluated rounds that reached too few clients
    (``Coverage``) are written but left out of the summary's figures, and the run then ends ``degraded``;
    so does a run with idle rounds (no update accepted), whose figures stand (``figures_stand``).
    """

    def __init__(self, out_dir: str | Path, config: Mapping[str, Any], num_rounds: int, log: Any = None,
                 trackers: RunTrackers | None = None, coverage: Coverage = Coverage(), figures: bool = True,
                 target: float = 0.0) -> None:
        self.out_dir = Path(out_dir)
        #: the accuracy whose first round the summary reports (``rounds_to_target``; 0: none)
        self.target = target
        #: draw the learning curve at the end (``False``: the numbers only)
        self.figures = figures
        self.trackers = trackers
        self._last_elapsed = 0.0
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.num_rounds = num_rounds
        self.coverage = coverage
        #: the evaluated rounds that count (they reached enough clients), and the rounds that fell short
        self.evaluations: list[dict[str, Any]] = []
        self.short_evaluations: list[int] = []
        self.short_trainings: list[int] = []
        #: the run's failing clients, reported in the summary (set by the ServerApp)
        self.failures: FailureAccount | None = None
        self._log = log or (lambda msg: logger.info(msg))
        self._t0 = time.perf_counter()
        #: training rounds in which no client update was accepted (every reply refused or failed)
        self.idle: list[int] = []
        (self.out_dir / CONFIG).write_text(json.dumps(dict(config), indent=2, sort_keys=True))
        (self.out_dir / METRICS).write_text("")

    @classmethod
    def resume(cls, out_dir: str | Path, num_rounds: int, last_round: int, elapsed: float, log: Any = None,
               trackers: RunTrackers | None = None, coverage: Coverage = Coverage(), figures: bool = True,
               target: float = 0.0) -> RunRecorder:
        """Continue writing into an existing results folder after round ``last_round``: rows of later
        rounds (written before a crash) are dropped, so none is duplicated or half-written, and the
        clock continues from ``elapsed``."""
        self = cls.__new__(cls)
        self.out_dir, self.num_rounds, self.trackers, self.coverage = Path(out_dir), num_rounds, trackers, coverage
        self.figures, self.target = figures, target
        self.failures = None
        self._log = log or (lambda msg: logger.info(msg))
        self._t0 = time.perf_counter() - elapsed
        for name in (METRICS, CLIENTS):
            path = self.out_dir / name
            if path.exists():
                kept = [line for line in _complete_lines(path) if json.loads(line)["round"] <= last_round]
                tmp = path.with_name(path.name + ".tmp")
                tmp.write_text("".join(line + "\n" for line in kept))
                tmp.replace(path)
        rows = list(map(json.loads, _complete_lines(self.out_dir / METRICS)))
        evaluated = [{k: v for k, v in row.items() if k not in ("phase", "elapsed_s")} for row in rows
                     if row["phase"] == "evaluate" and MEAN in row]
        self.evaluations = [row for row in evaluated if not coverage.short_evaluation(row)]
        self.short_evaluations = [row["round"] for row in evaluated if coverage.short_evaluation(row)]
        self.short_trainings = [row["round"] for row in rows if row["phase"] == "train" and coverage.short_training(row)]
        self.idle = [row["round"] for row in rows if row["phase"] == "train" and _idle(row)]
        self._last_elapsed = max((row["elapsed_s"] for row in rows if row["phase"] == "train"), default=0.0)
        return self

    def _append(self, row: Mapping[str, Any], name: str = METRICS) -> None:
        with (self.out_dir / name).open("a") as fh:
            fh.write(json.dumps(row) + "\n")

    def on_client_evaluations(self, server_round: int, rows: list[Mapping[str, Any]]) -> None:
        """Every client's own evaluation (``clients.jsonl``): the distribution behind the round's means."""
        with (self.out_dir / CLIENTS).open("a") as fh:
            fh.writelines(json.dumps({"round": server_round, **row}) + "\n" for row in sorted(rows, key=lambda r: str(r.get("node-id"))))
        if self.trackers is not None:
            self.trackers.on_client_accuracies(server_round, [row[ACCURACY] for row in rows if ACCURACY in row and not row.get(NEW_CLIENT_ROW)])

    def on_train(self, server_round: int, metrics: Mapping[str, Any]) -> None:
        """A training round's metrics; with ``clients-accepted`` = 0 it counts as idle."""
        if _idle(metrics):
            self.idle.append(server_round)
        if self.coverage.short_training(metrics):
            self.short_trainings.append(server_round)
        elapsed = self.elapsed
        self._append({"round": server_round, "phase": "train", "elapsed_s": elapsed, **{k: float(v) for k, v in metrics.items()}})
        if self.trackers is not None:
            self.trackers.on_train(server_round, metrics, elapsed - self._last_elapsed)
        self._last_elapsed = elapsed

    def on_evaluate(self, server_round: int, metrics: Mapping[str, Any]) -> None:
        """An evaluated round's metrics (``flower_pfl.engine.client_metrics.round_metrics``); it enters the summary
        when it has ``accuracy-mean``."""
        row = {"round": server_round, **{k: v if isinstance(v, list) else float(v) for k, v in metrics.items()}}
        self._append({"round": server_round, "phase": "evaluate", "elapsed_s": self.elapsed, **row})
        if self.trackers is not None:
            self.trackers.on_evaluate(server_round, metrics)
        if MEAN not in row:
            self._log(no_accuracy_line(server_round, self.num_rounds, self.elapsed))
            return
        if self.coverage.short_evaluation(row):  # written, but not a figure of the run
            self.short_evaluations.append(server_round)
            self._log(progress_line(server_round, self.num_rounds, row, self.elapsed, self.best_mean)
                      + short_round_note(row, self.coverage.evaluated, self.coverage.clients))
            return
        self.evaluations.append(row)
        self._log(progress_line(server_round, self.num_rounds, row, self.elapsed, self.best_mean))

    @property
    def best_mean(self) -> float:
        """The best ``accuracy-mean`` recorded so far (BMTA; ``-inf`` before any)."""
        return max((e[MEAN] for e in self.evaluations), default=-math.inf)

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self._t0

    def finish(self, title: str = "", extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Write ``summary.json`` and the learning curve (its band: the clients' spread from
        ``clients.jsonl``, see ``flower_pfl.reports.figures.spread_band``); returns the summary, with the run's
        cost from every row of ``metrics.jsonl`` (``flower_pfl.run.cost.cost_summary``)."""
        if self.evaluations:
            summary: dict[str, Any] = summarize_run(self.evaluations, self.num_rounds, target=self.target)
        elif self.short_evaluations:
            summary = {"evaluated_rounds": 0, "error": f"no evaluated round reached {self.coverage.evaluated} of the "
                       f"{self.coverage.clients} clients (min-evaluated-share {self.coverage.share:g}); see the run's log"}
        else:
            summary = {"evaluated_rounds": 0, "error": "no client evaluation succeeded; see the run's log"}
        summary.update(test_set_sizes(self.out_dir / CLIENTS))
        summary.update(cost_summary(map(json.loads, _complete_lines(self.out_dir / METRICS))))  # a resumed run's rows too
        if few := summary.get("clients_with_few_test_samples"):
            self._log(f"flower-pfl: {few} of the {summary['client_test_samples']['clients']} evaluated clients have fewer than "
                      f"{HANDFUL} test samples: each counts as much as any other in the unweighted mean (min-test-samples "
                      "leaves such natural clients out)")
        summary.update({"status": self._status(), "idle_rounds": self.idle_rounds, **self._shortfalls(),
                        "num_rounds": self.num_rounds, "wall_time_s": self.elapsed,
                        "seconds_per_round": self.elapsed / max(self.num_rounds, 1), **(extra or {})})
        (self.out_dir / SUMMARY).write_text(json.dumps(summary, indent=2, sort_keys=True))
        if self.evaluations and self.figures:
            clients = self.out_dir / CLIENTS
            per_client = client_accuracies(map(json.loads, _complete_lines(clients))) if clients.exists() else None
            try:
                plot_learning_curve(self.evaluations, self.out_dir / CURVE, title, per_client)
            except MissingExtra as err:  # the figures are optional: the results are complete without them
                self._log(f"flower-pfl: {CURVE} not drawn: {err}")
        if self.trackers is not None:  # the summary, and the curve and heatmaps as images
            self.trackers.finish(summary, sorted(self.out_dir.glob("*.png")), self.num_rounds, failed=not self.evaluations)
        self._report(summary)
        return summary

    @property
    def idle_rounds(self) -> int:
        return len(self.idle)

    def _status(self) -> str:
        """``failed`` without a counted evaluation, ``degraded`` with short or idle rounds, else ``completed``."""
        if not self.evaluations:
            return "failed"
        return "degraded" if self.short_evaluations or self.short_trainings or self.idle else "completed"

    def _shortfalls(self) -> dict[str, Any]:
        """The summary's account of short rounds (how many, from when, what a round had to reach) and of
        the clients that failed."""
        out: dict[str, Any] = {"federation_clients": self.coverage.clients, "min_clients_evaluated": self.coverage.evaluated,
                               "short_evaluated_rounds": len(self.short_evaluations),
                               "short_training_rounds": len(self.short_trainings),
                               **(self.failures.summary() if self.failures is not None else {})}
        if self.short_evaluations:
            out["short_evaluated_since"] = min(self.short_evaluations)
        if self.short_trainings:
            out["short_training_since"] = min(self.short_trainings)
        if self.idle:
            out["idle_since"] = min(self.idle)
        return out

    def fail(self, reason: str) -> None:
        """Write ``summary.json`` for a run that stopped because it could not achieve anything."""
        summary = {"status": "failed", "error": reason, "idle_rounds": self.idle_rounds, **self._shortfalls(),
                   "num_rounds": self.num_rounds, "wall_time_s": self.elapsed}
        (self.out_dir / SUMMARY).write_text(json.dumps(summary, indent=2, sort_keys=True))
        self._report(summary)

    def _report(self, summary: Mapping[str, Any]) -> None:
        """The closing block on the console (``flower_pfl.run.progress.summary_lines``)."""
        for line in summary_lines(summary, self.out_dir):
            self._log(line)


class RunFailed(RuntimeError):
    """A run that cannot achieve anything (no accepted updates, no finite accuracy); the message says why."""


def draw_partition(out_dir: Path, info: Mapping[int, Mapping[str, Any]], title: str = "", log: Any = None) -> bool:
    """Draw ``partition.png`` in ``out_dir`` from the nodes' start-up answers ``info`` (``label-counts`` by
    partition id, ``flower_pfl.reports.figures.label_counts``); whether it was drawn: not where no client
    reported its counts, nor without Flower Datasets (said through ``log``, as the learning curve's figure is)."""
    counts = label_counts(info)
    if counts is None:
        return False
    try:
        plot_partition(counts, out_dir / PARTITION, title)
    except Exception as err:  # the figures are optional: a run goes on without them (MissingExtra: the extra to install)
        why = str(err) if isinstance(err, MissingExtra) else f"{type(err).__name__}: {err}"
        (log or (lambda msg: logger.info(msg)))(f"flower-pfl: {PARTITION} not drawn: {why}")
        return False
    return True


def figures_stand(summary: Mapping[str, Any]) -> bool:
    """Whether a summary's figures are the run's own: ``completed``, or ``degraded`` by idle rounds alone.
    An idle round whose every client replied was the method's own outcome (its updates were refused, a
    diverged method's say), which a rerun repeats; rounds short of clients make the figures not
    comparable (older summaries have no ``status``)."""
    status = summary.get("status", "completed")
    only_idle = not summary.get("short_evaluated_rounds", 0) and not summary.get("short_training_rounds", 0)
    return "bmta" in summary and (status == "completed" or (status == "degraded" and only_idle))


def _idle(train_metrics: Mapping[str, Any]) -> bool:
    return train_metrics.get("clients-accepted", 1) == 0


def save_models(path: Path, ids: list[Any], rows: Any, initial: Any) -> None:
    """Every client's model (``rows`` in the order of ``ids``: a ``(m, d)`` tensor, or
    ``flower_pfl.engine.memory.Blocks`` of it) and the initial model, as safetensors."""
    from flower_pfl.run.tensor_files import write

    write(path, {"rows": rows, "initial": initial}, {"ids": list(ids)})


def load_models(path: str | Path) -> tuple[list[Any], Any, Any]:
    """``(ids, rows, initial)`` of a ``personalized_models.safetensors``."""
    from flower_pfl.run.tensor_files import read

    tensors, meta = read(path)
    return meta["ids"], tensors["rows"], tensors["initial"]


def save_state(path: Path, state: Mapping[str, Any]) -> None:
    """A method's learned state (``flower_pfl.run.tensor_files.pack`` form), as safetensors."""
    from flower_pfl.run.tensor_files import pack, write

    tensors: dict[str, Any] = {}
    write(path, tensors, {"state": pack(dict(state), "state", tensors)})


def load_state(path: str | Path) -> dict[str, Any]:
    from flower_pfl.run.tensor_files import read, unpack

    tensors, meta = read(path)
    return unpack(meta["state"], tensors)


def _complete_lines(path: Path) -> list[str]:
    """The lines of a JSON-lines file that parse (a line cut short by a crash does not)."""
    out = []
    for line in path.read_text().splitlines():
        try:
            json.loads(line)
        except json.JSONDecodeError:
            continue
        out.append(line)
    return out
