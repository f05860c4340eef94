"""Flower's own share of an in-process round, with nothing of the package: what Flower's ``FedAvg`` does on
the server with a round's messages, one per client (its ``configure_train`` / ``configure_evaluate``, a reply
``Message`` per client as a ClientApp makes it, its ``aggregate_train`` / ``aggregate_evaluate``). Added to
the bare loops' time (``benchmarks.client_floor``), it is the least an in-process round of the package can
take while Flower's ``FedAvg`` gets one message per client.

    python -m benchmarks.flower_message_floor                     # 100 clients evaluated, 20 of them trained
    python -m benchmarks.flower_message_floor --clients 1000 --per-round 100

The model's arrays are the DNN's on Synthetic (``--shapes``: 60 features, 20 hidden units, 10 classes); the
times are medians over ``--repeats`` rounds, on one thread.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg

from benchmarks.client_speed import machine
from client_apps.flower_internals import TaskIdentity
from strategies.arrays import numpy_record

#: the DNN's arrays on Synthetic(0.5, 0.5): 60 features, 20 hidden units, 10 classes
DNN_SHAPES: dict[str, tuple[int, ...]] = {"fc1.weight": (20, 60), "fc1.bias": (20,), "fc2.weight": (10, 20), "fc2.bias": (10,)}


class _Nodes:
    """The part of a Grid ``FedAvg`` asks for when it samples: the connected node ids."""

    def __init__(self, count: int) -> None:
        self.ids = list(range(1, count + 1))

    def get_node_ids(self) -> list[int]:
        return self.ids


def _timed(step: Any) -> tuple[float, Any]:
    began = time.perf_counter()
    out = step()
    return time.perf_counter() - began, out


def evaluation_floor(clients: int, repeats: int, shapes: dict[str, tuple[int, ...]] = DNN_SHAPES) -> tuple[dict[str, float], MetricRecord]:
    """Median seconds of Flower's ``FedAvg`` evaluating ``clients`` clients: its instructions, a reply of
    loss, accuracy and sample count per client, its aggregation; and the aggregated record of the last round."""
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    arrays = numpy_record({k: np.zeros(s, np.float32) for k, s in shapes.items()})
    strategy, nodes = FedAvg(fraction_evaluate=1.0, min_evaluate_nodes=clients, min_available_nodes=clients), _Nodes(clients)
    times: dict[str, list[float]] = {"configure": [], "replies": [], "aggregate": []}
    aggregated: Any = None
    for _ in range(repeats):
        seconds, sent = _timed(lambda: list(strategy.configure_evaluate(1, arrays, ConfigRecord({}), nodes)))  # type: ignore[arg-type]
        times["configure"].append(seconds)
        seconds, replies = _timed(lambda: [Message(RecordDict({"metrics": MetricRecord(
            {"loss": 1.0 + i / clients, "accuracy": (i % 10) / 10, "num-examples": 10 + i % 7})}), reply_to=m)
            for i, m in enumerate(sent)])  # noqa: B023
        times["replies"].append(seconds)
        seconds, aggregated = _timed(lambda: strategy.aggregate_evaluate(1, replies))  # noqa: B023
        times["aggregate"].append(seconds)
    return _medians(times), aggregated


def training_floor(clients: int, per_round: int, repeats: int,
                   shapes: dict[str, tuple[int, ...]] = DNN_SHAPES) -> tuple[dict[str, float], Any]:
    """Median seconds of Flower's ``FedAvg`` training ``per_round`` of ``clients`` clients: its instructions, a
    reply of the model's arrays and metrics per client, its aggregation (which reads every reply's arrays);
    and the aggregated arrays of the last round."""
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    rng = np.random.default_rng(0)
    arrays = numpy_record({k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()})
    strategy = FedAvg(fraction_train=per_round / clients, min_train_nodes=per_round, min_available_nodes=clients)
    nodes = _Nodes(clients)
    trained = [numpy_record({k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}) for _ in range(per_round)]
    times: dict[str, list[float]] = {"configure": [], "replies": [], "aggregate": []}
    aggregated: Any = None
    for _ in range(repeats):
        seconds, sent = _timed(lambda: list(strategy.configure_train(1, arrays, ConfigRecord({}), nodes)))  # type: ignore[arg-type]
        times["configure"].append(seconds)
        seconds, replies = _timed(lambda: [Message(RecordDict({"arrays": trained[i], "metrics": MetricRecord(
            {"train-loss": 0.5, "num-examples": 10 + i})}), reply_to=m) for i, m in enumerate(sent)])  # noqa: B023
        times["replies"].append(seconds)
        seconds, aggregated = _timed(lambda: strategy.aggregate_train(1, replies))  # noqa: B023
        times["aggregate"].append(seconds)
    return _medians(times), aggregated


def _medians(times: dict[str, list[float]]) -> dict[str, float]:
    out = {k: statistics.median(v) for k, v in times.items()}
    return {**out, "total": sum(out.values())}


def main(argv: Sequence[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=100, help="clients evaluated (default 100)")
    parser.add_argument("--per-round", type=int, default=20, help="clients trained (default 20)")
    parser.add_argument("--repeats", type=int, default=30, help="rounds timed (default 30)")
    args = parser.parse_args(argv)
    import logging

    import torch

    torch.set_num_threads(1)
    flower, level = logging.getLogger("flwr"), logging.getLogger("flwr").level
    flower.setLevel(logging.WARNING)  # FedAvg logs each aggregation
    try:
        evaluation, _ = evaluation_floor(args.clients, args.repeats)
        training, _ = training_floor(args.clients, args.per_round, args.repeats)
    finally:
        flower.setLevel(level)
    print(f"# Flower's FedAvg alone, ms: {machine()}\n")
    print("| round | configure | replies | aggregate | total |\n|---|---:|---:|---:|---:|")
    for name, row in ((f"evaluation of {args.clients} clients", evaluation), (f"training of {args.per_round} clients", training)):
        print(f"| {name} | " + " | ".join(f"{1e3 * row[k]:.2f}" for k in ("configure", "replies", "aggregate", "total")) + " |")
    return {"evaluation": evaluation, "training": training}


if __name__ == "__main__":
    main()
