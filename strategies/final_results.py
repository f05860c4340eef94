"""The closing block of a Message-API strategy's ``start``, a line per round and phase.

Flower's ``Strategy.start`` ends by pretty-printing every round's metrics, a line per metric once a
round's metrics do not fit on one line: 70 lines for five rounds of a package strategy, whose rounds
add reply counts and the personalized summary to the app's own metrics. The package's strategies
print the same figures a line per round and phase instead (``compact_final_results``); the
``Result`` that ``start`` returns is Flower's, whole."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from logging import INFO
from typing import Any

from flwr.common.logger import log
from flwr.serverapp.strategy import Result

from flower_pfl.run.quiet import FLOWER_LOGGER

#: the line that opens the closing block of Flower's ``start``
FINAL_RESULTS = "Final results:"


class _FlowersClosingBlock(logging.Filter):
    """Drops what Flower's ``start`` logs, in the thread that runs it, from its closing block on."""

    def __init__(self) -> None:
        super().__init__()
        self.thread, self.inside = threading.get_ident(), False

    def filter(self, record: logging.LogRecord) -> bool:
        if record.thread != self.thread or record.funcName != "start":
            return True
        self.inside = self.inside or record.getMessage() == FINAL_RESULTS
        return not self.inside


@contextmanager
def compact_final_results() -> Iterator[None]:
    """Inside, Flower's closing block is left out; ``log_final_results`` prints its figures."""
    block = _FlowersClosingBlock()
    logger = logging.getLogger(FLOWER_LOGGER)
    logger.addFilter(block)
    try:
        yield
    finally:
        logger.removeFilter(block)


def log_final_results(result: Result) -> None:
    """The figures of Flower's closing block: the final arrays' size and every round's metrics, a
    line per round and phase (``metric value``, floats with 4 decimals in scientific notation, as Flower's)."""
    log(INFO, "Final results, a line per round and phase (the returned Result holds them all):")
    log(INFO, "\tGlobal Arrays: %s", _size(result))
    for label, rounds in (("train", result.train_metrics_clientapp), ("evaluate", result.evaluate_metrics_clientapp),
                          ("server-side evaluate", result.evaluate_metrics_serverapp)):
        for server_round, metrics in sorted(rounds.items()):
            log(INFO, "\tround %s %s: %s", server_round, label, _line(metrics))
    log(INFO, "")


def _size(result: Result) -> str:
    return f"ArrayRecord ({sum(len(array.data) for array in result.arrays.values()) / 2**20:.3f} MB)"


def _line(metrics: Mapping[str, Any]) -> str:
    return ", ".join(f"{key} {_value(value)}" for key, value in sorted(metrics.items())) or "(none)"


def _value(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(map(_value, value)) + "]"
    return f"{value:.4e}" if isinstance(value, float) else str(value)
