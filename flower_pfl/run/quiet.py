"""Quiet console output: the package's progress lines stay, Flower's round-by-round narration goes.

Dropped while a run goes (``dropping``, with the files ``server_apps.console`` names): INFO and
DEBUG records of Flower's strategy loops (both APIs: ``[ROUND n]``, ``configure_train: ...``,
``Aggregated MetricRecord``, the final history dump) and the per-round lines of this package's
strategies. Dropped in every process that loads the apps (``silence_runtime_noise``): Ray's
``FutureWarning`` tip about accelerator variables (the setting it suggests would change which GPUs
clients see, so only the message goes) and the ``Manually terminating ClientAppActor`` warning each
Ray actor logs when a simulation ends; a run stopped by one of the package's own errors is logged
without its traceback (``PlainRefusals``). No other warning or error is dropped. A simulation's
per-message error tracebacks go to the run's ``failures.log`` (``DivertRecords``).

Run config ``verbose = true`` keeps Flower's round loop; the environment variable
``FLOWER_PFL_VERBOSE=1`` (in the environment the SuperLink was started with) keeps everything.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

#: the logger Flower logs everything to
FLOWER_LOGGER = "flwr"
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


@contextmanager
def dropping(sources: Iterable[str], enabled: bool = True, logger: str = FLOWER_LOGGER) -> Iterator[None]:
    """Drop INFO and DEBUG records logged from ``sources`` to ``logger`` inside the block, unless
    ``enabled`` is false or ``FLOWER_PFL_VERBOSE`` is set (``server_apps.console`` names Flower's
    round loop)."""
    if not enabled or verbose_env():
        yield
        return
    drop = DropRecords(sources)
    logging.getLogger(logger).addFilter(drop)
    try:
        yield
    finally:
        logging.getLogger(logger).removeFilter(drop)


class DivertRecords(logging.Filter):
    """ERROR records logged by ``sources`` (``(file, function)`` pairs: a simulation's per-message error
    handlers and their tracebacks) go to a file, not the console: held in memory (at most ``limit``)
    until ``write_to`` names the file. The package's own one line per node and cause
    (``strategies.failures``) says what failed."""

    def __init__(self, sources: Iterable[tuple[str, str]], limit: int = 2000) -> None:
        super().__init__()
        self.sources = {(os.path.normcase(path), function) for path, function in sources}
        self.limit, self.count = limit, 0
        self.path: str | None = None
        self.held: list[str] = []
        self._format = logging.Formatter("%(asctime)s %(levelname)s %(message)s").format

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR or (os.path.normcase(record.pathname), record.funcName) not in self.sources:
            return True
        self.count += 1
        text = self._format(record)
        if self.path is not None:
            with open(self.path, "a") as fh:
                fh.write(text + "\n")
        elif len(self.held) < self.limit:
            self.held.append(text)
        return False

    def write_to(self, path: str | os.PathLike[str]) -> None:
        """From now on into ``path``, and what was held so far."""
        self.path = os.fspath(path)
        with open(self.path, "a") as fh:
            fh.writelines(text + "\n" for text in self.held)
        self.held.clear()


@contextmanager
def diverting(sources: Iterable[tuple[str, str]], logger: str = FLOWER_LOGGER) -> Iterator[DivertRecords | None]:
    """Inside the block, ERROR records from ``sources`` go to ``DivertRecords`` (None, and nothing
    diverted, with ``FLOWER_PFL_VERBOSE`` set)."""
    if verbose_env():
        yield None
        return
    divert = DivertRecords(sources)
    logging.getLogger(logger).addFilter(divert)
    try:
        yield divert
    finally:
        logging.getLogger(logger).removeFilter(divert)


class PlainRefusals(logging.Filter):
    """A run stopped by one of the package's own errors (``ConfigError``, ``RunFailed``, ...: an exception
    class defined in ``flower_pfl``) is one message: the record Flower logs with the exception keeps the
    message and loses the traceback. Any other exception keeps its traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if error is not None and type(error).__module__.split(".")[0] == "flower_pfl":
            record.msg, record.args = f"{record.getMessage()}: {type(error).__name__}: {error}", None
            record.exc_info, record.exc_text = None, None
        return True


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
    logging.getLogger(FLOWER_LOGGER).addFilter(DropRecords(templates=HARMLESS))
    logging.getLogger(FLOWER_LOGGER).addFilter(PlainRefusals())
