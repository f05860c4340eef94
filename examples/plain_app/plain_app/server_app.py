"""The app's ServerApp: the strategy is whatever class the run config names, started as Flower's FedAvg is."""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping
from logging import INFO
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Result

from plain_app.task import Net

app = ServerApp()


def strategy_from(path: str, arguments: Mapping[str, Any]) -> Any:
    """``package.module.Class`` called with ``arguments``."""
    module, name = path.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)(**arguments)


def run(grid: Grid, cfg: Mapping[str, Any]) -> Result:
    strategy = strategy_from(str(cfg["strategy"]), {"fraction_train": float(cfg["fraction-train"]),
                                                    **json.loads(str(cfg["strategy-args"]))})
    return strategy.start(grid=grid, initial_arrays=ArrayRecord(Net().state_dict()), num_rounds=int(cfg["num-rounds"]),
                          train_config=ConfigRecord({"lr": float(cfg["lr"]), "local-steps": int(cfg["local-steps"])}))


@app.main()
def main(grid: Grid, context: Context) -> None:
    result = run(grid, context.run_config)
    for server_round, metrics in sorted(result.evaluate_metrics_clientapp.items()):
        log(INFO, "plain-app: round %d eval-acc %.4f", server_round, float(metrics["eval-acc"]))
