"""A strategy's own trackers, for apps that are not the package's ServerApp (whose results folder
feeds the trackers itself): ``strategies.message.FedMCSA(tracker="tensorboard", tracker_dir="runs")``.

The first round opens ``<tracker_dir>/<Strategy>-<time>`` and the trackers in it
(``flower_pfl.run.trackers``); every round's aggregated training and evaluation metrics, and the
clients' accuracies as a histogram, go to them as they come; the Message API's ``start`` closes
them with the run's summary, the legacy API's at the end of the process (it has no end of run).
"""

from __future__ import annotations

import atexit
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from flower_pfl.engine.params import iter_values
from flower_pfl.engine.server_algorithm import ServerAlgorithm
from flower_pfl.experiment.config import parse_trackers
from flower_pfl.run.cost import COST_KEYS, cost_summary
from flower_pfl.run.summary import summarize_run
from flower_pfl.run.trackers import RunTrackers, TrackerSettings, require_trackers

#: what the ``tracker`` argument of a strategy takes
TrackerArg = str | Sequence[str] | TrackerSettings | None
TRACKER_DOC = ("Live trackers: \"tensorboard\", \"mlflow\", \"wandb\" (comma-separated or a list), or a "
               "``flower_pfl.run.trackers.TrackerSettings`` (MLflow experiment and URI, group); None: none. Each round's "
               "aggregated metrics, the clients' accuracy histogram and, at the end, the summary (``strategies.tracking``).")
TRACKER_DIR_DOC = ("Folder of the trackers' runs: ``<tracker_dir>/<Strategy>-<time>`` (TensorBoard's events, W&B's offline "
                   "files); MLflow's SQLite store is ``<tracker_dir>/mlflow.db`` unless the settings name a URI.")


def tracker_settings(tracker: TrackerArg) -> TrackerSettings:
    """``"tensorboard,mlflow"``, a sequence of names or a ``TrackerSettings`` (experiment, MLflow URI, group)
    as settings; checks the names and that their extras are installed."""
    settings = tracker if isinstance(tracker, TrackerSettings) else TrackerSettings(parse_trackers(tracker))
    require_trackers(settings.names)
    return settings


class StrategyTracking:
    """Opened on the first round, fed by the strategy, closed by ``finish`` (see the module docstring)."""

    def __init__(self, settings: TrackerSettings, folder: str | Path, strategy: str, method: ServerAlgorithm,
                 options: Mapping[str, Any], accuracy_key: str) -> None:
        self.settings, self.parent, self.strategy, self.accuracy_key = settings, Path(folder), strategy, accuracy_key
        self.config = {"strategy": strategy, **{spec.key or spec.name: value for spec, value in iter_values(method)
                                                if isinstance(value, int | float | str | bool)}, **options}
        self.run: RunTrackers | None = None
        self.evaluations: list[dict[str, Any]] = []
        #: every round's cost figures (``flower_pfl.run.cost``), for the summary's totals
        self.costs: list[dict[str, Any]] = []
        self.last_round = 0

    @classmethod
    def of(cls, tracker: TrackerArg, folder: str, strategy: Any, options: Mapping[str, Any]) -> StrategyTracking | None:
        """The tracking of ``strategy`` (its method, accuracy key and ``options`` as the run's parameters), or
        None without trackers."""
        settings = tracker_settings(tracker)
        if not settings.names:
            return None
        return cls(settings, folder, type(strategy).__name__, strategy.server.method, options, strategy.accuracy_key)

    def _open(self) -> RunTrackers:
        if self.run is None:
            stamp = time.strftime("%Y%m%d-%H%M%S")
            folder = self.parent / f"{self.strategy}-{stamp}"
            n = 1
            while folder.exists():
                n += 1
                folder = self.parent / f"{self.strategy}-{stamp}-{n}"
            self.run = RunTrackers(self.settings, folder, folder.name, self.config)
            atexit.register(self.finish)
        return self.run

    def train(self, server_round: int, metrics: Mapping[str, Any]) -> None:
        self.last_round = max(self.last_round, server_round)
        self._open().on_train(server_round, metrics)
        self.costs.append({"phase": "train", **_cost_of(metrics)})

    def evaluate(self, server_round: int, metrics: Mapping[str, Any], accuracies: Sequence[float]) -> None:
        self.last_round = max(self.last_round, server_round)
        run = self._open()
        run.on_evaluate(server_round, metrics)
        run.on_client_accuracies(server_round, accuracies)
        self.costs.append({"phase": "evaluate", **_cost_of(metrics)})
        if f"{self.accuracy_key}-mean" in metrics:
            self.evaluations.append({"round": server_round, **metrics})

    def finish(self) -> None:
        """The run's summary (BMTA and the others of ``flower_pfl.run.summary``, the cost of
        ``flower_pfl.run.cost``), then the trackers closed."""
        if self.run is None:
            return
        run, self.run = self.run, None
        atexit.unregister(self.finish)
        summary = summarize_run(self.evaluations, self.last_round, self.accuracy_key) if self.evaluations else {}
        summary = {**summary, **cost_summary(self.costs)}
        run.finish({k: v for k, v in summary.items() if not (isinstance(v, float) and math.isnan(v))}, step=self.last_round)


def _cost_of(metrics: Mapping[str, Any]) -> dict[str, Any]:
    return {k: metrics[k] for k in (*COST_KEYS, "clients-accepted") if k in metrics}
