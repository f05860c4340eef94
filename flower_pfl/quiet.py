"""Quiet console output: the package's progress lines stay, Flower's round-by-round narration goes.

Dropped while a run goes (``quiet_round_loop``): INFO and DEBUG records that Flower's strategy loops
log (both APIs: ``[ROUND n]``, ``configure_train: ...``, ``Aggregated MetricRecord``, the final
history dump) and the per-round lines of this package's strategies. Dropped in every process that
loads the apps (``silence_runtime_noise``): Ray's ``FutureWarning`` tip about accelerator variables
(the setting it suggests would change which GPUs clients see, so only the message goes) and the
``Manually terminating ClientAppActor`` warning each Ray actor logs when a simulation ends.
Warnings and errors are never dropped otherwise.

Run config ``verbose = true`` keeps Flower's round loop; the environment variable
``FLOWER_PFL_VERBOSE=1`` (in the environment the SuperLink was started with) keeps everything.
"""

from __future__ import annotations

import logging
import os
import warnings
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Iterable, Iterator

from flwr.common.logger import FLOWER_LOGGER

#: ``FLOWER_PFL_VERBOSE=1`` keeps all of Flower's and Ray's output
VERBOSE_ENV = "FLOWER_PFL_VERBOSE"
#: message templates dropped at any level: the warning each Ray actor logs when a simulation ends it
HARMLESS = frozenset({"Manually terminating %s"})
#: start of Ray's FutureWarning on every ``ray.init``
RAY_ACCELERATOR_TIP = r"Tip: In future versions of Ray, Ray will no longer override accelerator"


def verbose_env() -> bool:
    """Whether ``FLOWER_PFL_VERBOSE`` asks for everything."""
    return os.environ.get(VERBOSE_ENV, "").strip().lower() not in ("", "0", "false", "no")


class DropRecords(logging.Filter):
    """Drops records below ``WARNING`` logged from ``sources`` (files, or folders ending in a
    separator), and records whose message template is one of ``templates`` (any level)."""

    def __init__(self, sources: Iterable[str] = (), templates: Iterable[str] = ()) -> None:
        super().__init__()
        self.sources = tuple(os.path.normcase(s) for s in sources)
        self.templates = frozenset(templates)

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and record.msg in self.templates:
            return False
        return record.levelno >= logging.WARNING or not os.path.normcase(record.pathname).startswith(self.sources)


def _source(module: ModuleType) -> str:
    """A package's folder (with a trailing separator) or a module's file."""
    path = Path(module.__file__ or "")
    return str(path.parent) + os.sep if path.name == "__init__.py" else str(path)


def round_loop_sources() -> tuple[str, ...]:
    """The files that narrate rounds: Flower's strategy loops and strategies (both APIs) and this
    package's strategies (``strategies.nodes``, which says when a round waits for nodes, stays)."""
    import flwr.server.compat
    import flwr.server.server
    import flwr.server.strategy
    import flwr.serverapp.strategy
    import strategies.legacy
    import strategies.message.method_strategy

    return tuple(_source(m) for m in (flwr.serverapp.strategy, flwr.server.strategy, flwr.server.compat, flwr.server.server,
                                      strategies.legacy, strategies.message.method_strategy))


@contextmanager
def quiet_round_loop(enabled: bool = True, logger: logging.Logger = FLOWER_LOGGER) -> Iterator[None]:
    """Drop the round loop's INFO lines from ``logger`` (Flower's) inside the block, unless
    ``enabled`` is false or ``FLOWER_PFL_VERBOSE`` is set."""
    if not enabled or verbose_env():
        yield
        return
    drop = DropRecords(round_loop_sources())
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


_silenced = False


def silence_runtime_noise() -> None:
    """Drop Ray's accelerator tip and the actors' termination warning in this process (once;
    nothing with ``FLOWER_PFL_VERBOSE`` set). The apps call it when they are loaded, which in a
    simulation is before Ray starts."""
    global _silenced
    if _silenced or verbose_env():
        return
    _silenced = True
    warnings.filterwarnings("ignore", message=RAY_ACCELERATOR_TIP, category=FutureWarning)
    FLOWER_LOGGER.addFilter(DropRecords(templates=HARMLESS))
