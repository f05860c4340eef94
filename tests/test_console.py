"""Console output: progress and summary text, and what the quiet mode drops (never warnings or errors)."""

from __future__ import annotations

import inspect
import logging
import math
import warnings

import flwr.serverapp.strategy
import pytest
from flwr.common.logger import FLOWER_LOGGER

from client_apps.flower_internals import server_loop
from flower_pfl.run import quiet
from flower_pfl.run.progress import clock, eta, progress_line, summary_lines
from flower_pfl.run.results import RunRecorder
from server_apps.console import quiet_round_loop, round_loop_sources
from server_apps.inprocess import run_in_process


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    @property
    def messages(self) -> list[str]:
        return [r.getMessage() for r in self.records]


@pytest.fixture
def flower_lines():
    handler = Lines()
    FLOWER_LOGGER.addHandler(handler)
    yield handler
    FLOWER_LOGGER.removeHandler(handler)


def _record(level: int, pathname: str, msg: str = "[ROUND %s/%s]", args: tuple = (1, 10)) -> logging.LogRecord:
    return logging.LogRecord("flwr", level, pathname, 1, msg, args, None)


def test_clock_and_eta_by_hand():
    assert [clock(s) for s in (0, 59.4, 59.6, 75, 3725, math.nan, -1)] == ["0:00", "0:59", "1:00", "1:15", "1:02:05", "?", "?"]
    assert eta(5, 100, 50.0) == 950.0  # 10 s a round, 95 rounds left
    assert eta(100, 100, 80.0) == 0.0 and math.isnan(eta(0, 100, 1.0))


def test_progress_line_by_hand():
    row = {"accuracy-mean": 0.74231, "accuracy-std": 0.21, "accuracy": 0.77}
    assert progress_line(25, 100, row, 75.0, 0.75) == (
        "flower-pfl: round  25/100  accuracy-mean 0.7423 (std 0.2100, weighted 0.7700, best 0.7500)  1:15 elapsed, ETA 3:45")


def test_summary_block_of_a_completed_and_a_failed_run():
    summary = {"bmta": 0.8, "bmta_round": 95, "bmta_weighted": 0.79, "last10_mean_accuracy": 0.7941,
               "last10_mean_accuracy_weighted": 0.7845, "final_accuracy": 0.79, "final_accuracy_std": 0.2074,
               "status": "completed", "num_rounds": 100, "wall_time_s": 52.4, "seconds_per_round": 0.524}
    assert summary_lines(summary, "/r/x") == [
        "flower-pfl: run completed: 100 rounds in 0:52, 0.52 s/round",
        "  BMTA           0.8000 at round 95 (sample-weighted 0.7900)",
        "  last-10% mean  0.7941 (sample-weighted 0.7845)",
        "  final          0.7900 (std over clients 0.2074)",
        "  results        /r/x",
    ]
    failed = {"status": "failed", "error": "3 of the run's 4 rounds accepted no client update", "num_rounds": 4, "wall_time_s": 61}
    assert summary_lines(failed, "/r/y") == [
        "flower-pfl: run failed after 1:01 (of 4 rounds)",
        "  error          3 of the run's 4 rounds accepted no client update",
        "  results        /r/y",
    ]


def test_recorder_logs_a_line_per_evaluated_round_with_the_best_so_far_and_a_closing_block(tmp_path):
    lines: list[str] = []
    recorder = RunRecorder(tmp_path, {}, 4, log=lines.append)
    recorder.on_evaluate(1, {"accuracy-mean": 0.6, "accuracy-std": 0.1, "accuracy": 0.65})
    recorder.on_evaluate(2, {"accuracy-mean": 0.5, "accuracy-std": 0.2, "accuracy": 0.55})
    recorder.on_evaluate(3, {"loss": 1.0})  # no client accuracy
    recorder.finish()
    assert lines[0].startswith("flower-pfl: round 1/4  accuracy-mean 0.6000 (std 0.1000, weighted 0.6500, best 0.6000)  ")
    assert lines[1].startswith("flower-pfl: round 2/4  accuracy-mean 0.5000 (std 0.2000, weighted 0.5500, best 0.6000)  ")
    assert lines[2].startswith("flower-pfl: round 3/4  no client accuracy")
    assert lines[3].startswith("flower-pfl: run completed: 4 rounds in ")
    assert lines[4] == "  BMTA           0.6000 at round 1 (sample-weighted 0.6500)"
    assert lines[-1] == f"  results        {tmp_path}"


def test_round_loop_filter_drops_flowers_narration_and_keeps_warnings_errors_and_other_sources():
    drop = quiet.DropRecords(round_loop_sources())
    loop, legacy = inspect.getfile(flwr.serverapp.strategy.Strategy), server_loop.__file__
    assert not drop.filter(_record(logging.INFO, loop)) and not drop.filter(_record(logging.INFO, legacy))
    assert not drop.filter(_record(logging.DEBUG, loop))
    assert drop.filter(_record(logging.WARNING, loop)) and drop.filter(_record(logging.ERROR, legacy))
    assert drop.filter(_record(logging.INFO, __file__))  # the package's own lines, and anyone else's
    assert drop.filter(_record(logging.INFO, server_loop.__file__.replace("server.py", "grid/grid.py")))


def test_quiet_round_loop_filters_flowers_logger_only_inside_the_block(flower_lines, monkeypatch):
    monkeypatch.delenv(quiet.VERBOSE_ENV, raising=False)
    loop = inspect.getfile(flwr.serverapp.strategy.Strategy)
    with quiet_round_loop():
        FLOWER_LOGGER.handle(_record(logging.INFO, loop))
        FLOWER_LOGGER.handle(_record(logging.ERROR, loop, "ServerApp failed: %s", ("boom",)))
        FLOWER_LOGGER.info("flower-pfl: round %d/%d", 5, 10)
    FLOWER_LOGGER.handle(_record(logging.INFO, loop, "[ROUND %s/%s]", (2, 10)))
    assert flower_lines.messages == ["ServerApp failed: boom", "flower-pfl: round 5/10", "[ROUND 2/10]"]


@pytest.mark.parametrize("enabled,env", [(False, None), (True, "1")])
def test_verbose_keeps_the_round_loop(flower_lines, monkeypatch, enabled, env):
    if env is None:
        monkeypatch.delenv(quiet.VERBOSE_ENV, raising=False)
    else:
        monkeypatch.setenv(quiet.VERBOSE_ENV, env)
    with quiet_round_loop(enabled=enabled):
        FLOWER_LOGGER.handle(_record(logging.INFO, inspect.getfile(flwr.serverapp.strategy.Strategy)))
    assert flower_lines.messages == ["[ROUND 1/10]"]


def test_runtime_noise_goes_other_warnings_stay(flower_lines, monkeypatch):
    monkeypatch.delenv(quiet.VERBOSE_ENV, raising=False)
    monkeypatch.setattr(quiet, "_silenced", False)
    before = list(FLOWER_LOGGER.filters)
    try:
        with warnings.catch_warnings(record=True) as caught:
            quiet.silence_runtime_noise()
            quiet.silence_runtime_noise()  # once is enough
            warnings.warn("Tip: In future versions of Ray, Ray will no longer override accelerator visible devices "
                          "env var if num_gpus=0", FutureWarning, stacklevel=1)
            warnings.warn("another FutureWarning", FutureWarning, stacklevel=1)
        FLOWER_LOGGER.warning("Manually terminating %s", "ClientAppActor")
        FLOWER_LOGGER.warning("Manually terminating the run because %s", "of this")
        FLOWER_LOGGER.error("ClientApp raised an exception")
        assert len(FLOWER_LOGGER.filters) == len(before) + 2  # the runtime noise, and refusals without a traceback
    finally:
        for added in [f for f in FLOWER_LOGGER.filters if f not in before]:
            FLOWER_LOGGER.removeFilter(added)
    assert [str(w.message) for w in caught] == ["another FutureWarning"]
    assert flower_lines.messages == ["Manually terminating the run because of this", "ClientApp raised an exception"]


@pytest.mark.parametrize("api,verbose", [("message", False), ("legacy", False), ("message", True)])
def test_a_run_prints_its_progress_and_flowers_loop_only_when_verbose(flower_lines, monkeypatch, tmp_path, api, verbose):
    monkeypatch.delenv(quiet.VERBOSE_ENV, raising=False)
    out = run_in_process({"api": api, "verbose": verbose, "num-rounds": 2, "clients-per-round": 2, "eval-every": 1,
                          "output-dir": str(tmp_path)}, num_clients=3)
    messages = flower_lines.messages
    ours = [m for m in messages if m.startswith("flower-pfl: round ")]
    assert [m.split("  ")[0] for m in ours] == ["flower-pfl: round 1/2", "flower-pfl: round 2/2"]
    assert f"  results        {out}" in messages
    narrated = [m for m in messages if m.startswith("[ROUND")]
    assert narrated == (["[ROUND 1/2]", "[ROUND 2/2]"] if verbose else [])
    assert not [f for f in FLOWER_LOGGER.filters if isinstance(f, quiet.DropRecords) and f.sources]  # removed after the run


def test_a_run_stopped_by_the_packages_own_error_is_logged_without_a_traceback():
    from flower_pfl.experiment.config import ConfigError
    from flower_pfl.run.results import RunFailed

    plain = quiet.PlainRefusals()
    for error in (ConfigError("run config 'lr' = -1 is invalid"), RunFailed("round 4: 3 of 12 nodes lost")):
        record = logging.LogRecord("flwr", logging.ERROR, "app.py", 1, "%s raised an exception", ("Simulation",),
                                   (type(error), error, None))
        assert plain.filter(record) and record.exc_info is None
        assert record.getMessage() == f"Simulation raised an exception: {type(error).__name__}: {error}"
    bug = ValueError("a bug")
    record = logging.LogRecord("flwr", logging.ERROR, "app.py", 1, "%s raised an exception", ("Simulation",),
                               (ValueError, bug, None))
    assert plain.filter(record) and record.exc_info is not None  # anything else keeps its traceback
