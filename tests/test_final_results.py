"""A package strategy's ``start`` closes with its figures a line per round and phase, in place of Flower's
pretty-printed block; nothing else of Flower's is touched."""

from __future__ import annotations

import logging
import threading
from logging import INFO

from flwr.app import Array, ArrayRecord, MetricRecord
from flwr.common.logger import log
from flwr.serverapp.strategy import Result

from strategies.final_results import compact_final_results, log_final_results


def start() -> None:
    """Logs as Flower's ``Strategy.start`` does: its rounds, then its closing block."""
    log(INFO, "[ROUND 1/1]")
    log(INFO, "Final results:")
    log(INFO, "\tAggregated ClientApp-side Train Metrics:")


def _messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records]


def test_only_the_closing_block_of_start_in_this_thread_is_left_out(caplog):
    caplog.set_level(INFO)
    filters = list(logging.getLogger("flwr").filters)
    with compact_final_results():
        start()
        log(INFO, "a line of the app's own")
        other = threading.Thread(target=start)  # another thread's ``start``: not this strategy's
        other.start()
        other.join()
    assert _messages(caplog) == ["[ROUND 1/1]", "a line of the app's own", "[ROUND 1/1]", "Final results:",
                                 "\tAggregated ClientApp-side Train Metrics:"]
    caplog.clear()
    start()  # after the block, Flower's lines are all there
    assert len(_messages(caplog)) == 3 and logging.getLogger("flwr").filters == filters


def test_the_figures_a_line_per_round_and_phase(caplog):
    caplog.set_level(INFO)
    result = Result(arrays=ArrayRecord({"w": Array(dtype="float32", shape=(2,), stype="numpy.ndarray", data=b"\0" * 2**20)}),
                    train_metrics_clientapp={2: MetricRecord({"train-loss": 0.5, "clients-accepted": 3}),
                                             1: MetricRecord({"train-loss": 0.25, "clients-accepted": 3})},
                    evaluate_metrics_clientapp={1: MetricRecord({"accuracy": 0.75, "accuracy-per-class": [0.5, 1.0]})})
    log_final_results(result)
    lines = [m for m in _messages(caplog) if m.startswith("\t")]
    assert lines == ["\tGlobal Arrays: ArrayRecord (1.000 MB)",
                     "\tround 1 train: clients-accepted 3, train-loss 2.5000e-01",
                     "\tround 2 train: clients-accepted 3, train-loss 5.0000e-01",
                     "\tround 1 evaluate: accuracy 7.5000e-01, accuracy-per-class [5.0000e-01, 1.0000e+00]"]
