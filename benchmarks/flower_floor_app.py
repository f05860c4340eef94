"""A minimal Flower app for ``benchmarks/flwr_floor.py``: what a round costs under ``flwr run`` when the
ClientApp does nothing and the ServerApp is Flower's own ``FedAvg``.

The ClientApp (Message API) answers at once: ``train`` returns the arrays it received with a
``MetricRecord`` of ``num-examples``, ``evaluate`` a ``MetricRecord``. The ServerApp runs
``flwr.serverapp.strategy.FedAvg`` (``Strategy.start``) on an MLR-sized model (the package's ``mlr`` on
Synthetic: a 10 x 60 weight and 10 biases) on every node (Flower's defaults: at least 2), and through ``evaluate_fn`` (which
``Strategy.start`` calls before the first round and after each) records when each round ended.

The run config (``[tool.flwr.app.config]`` of the app folder ``flwr_floor.floor_app`` writes):

- ``num-rounds``; ``fraction-evaluate``: 0.0 (training only) or 1.0 (an evaluation exchange every round);
- ``pull-interval``: seconds between the ServerApp's looks for replies (0: Flower's own, 0.1 s);
- ``record-dir``: where the ServerApp writes ``server.json`` (the rounds' end times) and every process
  hosting the ClientApp appends a line per message to ``<pid>.jsonl`` (its kind), so the benchmark can
  count the messages each kind of exchange sent.

``benchmarks/flwr_floor.py`` copies this file into the app folder: it imports nothing of the package.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

#: the package's ``mlr`` on Synthetic(0.5, 0.5): 60 features, 10 classes
FEATURES, CLASSES = 60, 10


def initial_arrays() -> ArrayRecord:
    """An MLR-sized model: a ``CLASSES x FEATURES`` weight and ``CLASSES`` biases (float32)."""
    return ArrayRecord([np.zeros((CLASSES, FEATURES), np.float32), np.zeros(CLASSES, np.float32)])


def _note(context: Context, kind: str) -> None:
    """One line per message in this process's file of the run's ``record-dir`` (none without one)."""
    folder = str(context.run_config.get("record-dir", ""))
    if folder:
        with (Path(folder) / f"{os.getpid()}.jsonl").open("a") as fh:
            fh.write(json.dumps({"kind": kind, "node": context.node_id, "time": time.time()}) + "\n")


clientapp = ClientApp()


@clientapp.train()
def train(msg: Message, context: Context) -> Message:
    """The received arrays back at once, as if trained on one example."""
    _note(context, "train")
    content = RecordDict({"arrays": msg.content.array_records["arrays"], "metrics": MetricRecord({"num-examples": 1})})
    return Message(content=content, reply_to=msg)


@clientapp.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """A loss and an accuracy at once, as if evaluated on one example."""
    _note(context, "evaluate")
    metrics = MetricRecord({"num-examples": 1, "loss": 0.0, "accuracy": 0.0})
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)


serverapp = ServerApp()


def run(grid: Grid, run_config: dict[str, Any]) -> list[float]:
    """Flower's ``FedAvg`` for ``num-rounds`` rounds on every node; the times (``time.time()``) at which
    round 0 (before the first) and each round ended, also written to ``record-dir/server.json``."""
    interval = float(run_config.get("pull-interval", 0.0))
    if interval > 0 and hasattr(grid, "pull_interval"):  # flwr run's in-memory grid (Flower's default: 0.1 s)
        grid.pull_interval = interval
    fraction = float(run_config["fraction-evaluate"])
    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=fraction)  # every node, at least 2 (Flower's defaults)
    ends: list[float] = []

    def round_ended(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        ends.append(time.time())
        return None

    start = time.time()
    strategy.start(grid, initial_arrays(), num_rounds=int(run_config["num-rounds"]), evaluate_fn=round_ended)
    folder = str(run_config.get("record-dir", ""))
    if folder:
        record = {"start": start, "ends": ends, "nodes": len(list(grid.get_node_ids())), "fraction_evaluate": fraction,
                  "pull_interval": getattr(grid, "pull_interval", None)}
        (Path(folder) / "server.json").write_text(json.dumps(record))
    return ends


@serverapp.main()
def main(grid: Grid, context: Context) -> None:
    run(grid, dict(context.run_config))
