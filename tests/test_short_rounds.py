"""A summary never overstates: evaluated rounds that reached too few clients are written but do not count,
and a run with short rounds, or rounds that accepted no update, ends ``degraded`` and says which (``flower_pfl.run.results.Coverage``)."""

from __future__ import annotations

import json

import pytest

from flower_pfl.experiment.config import ConfigError, ExperimentConfig
from flower_pfl.run.progress import summary_lines
from flower_pfl.run.results import Coverage, RunRecorder
from flower_pfl.tools import compare
from flower_pfl.tools.sweep_grid import Cell, finished, unfinished_reason


def _evaluation(mean: float, clients: int) -> dict[str, float]:
    return {"accuracy-mean": mean, "accuracy-std": 0.0, "accuracy": mean, "clients-evaluated": float(clients)}


def _train(accepted: int, failed: int = 0, rejected: int = 0) -> dict[str, float]:
    return {"train-loss": 1.0, "clients-accepted": accepted, "clients-failed": failed, "clients-rejected": rejected}


def test_coverage_by_hand():
    twelve = Coverage(clients=12, share=0.8)
    assert twelve.evaluated == 10  # ceil(9.6)
    assert Coverage(clients=10, share=0.8).evaluated == 8  # exactly 8.0, not 9 by float error
    assert Coverage(clients=12, share=0.0).evaluated == 0 and Coverage(clients=12, share=1.0).evaluated == 12
    assert twelve.short_evaluation({"clients-evaluated": 9}) and not twelve.short_evaluation({"clients-evaluated": 10})
    assert not twelve.short_evaluation({"loss": 1.0})  # a row without the count (another app's metrics) counts
    # training: replies (accepted or rejected) against the sampled clients (replies + failures)
    assert not twelve.short_training(_train(16, failed=4)) and twelve.short_training(_train(15, failed=5))
    assert not twelve.short_training(_train(10, rejected=10))  # rejected replies are replies: the clients ran
    assert not Coverage().short_training(_train(0, failed=20))  # share 0: nothing is ever short


def test_a_round_evaluated_on_one_client_never_makes_the_bmta(tmp_path):
    """The lost-worker case: full rounds, then rounds where one client of twelve was evaluated (at 1.0)."""
    lines: list[str] = []
    recorder = RunRecorder(tmp_path, {}, 20, log=lines.append, coverage=Coverage(clients=12, share=0.8))
    recorder.on_train(1, _train(12))
    recorder.on_evaluate(5, _evaluation(0.6, 12))
    recorder.on_train(6, _train(2, failed=10))
    recorder.on_evaluate(10, _evaluation(1.0, 1))
    recorder.on_evaluate(15, _evaluation(0.7, 11))
    recorder.on_evaluate(20, _evaluation(0.9, 3))
    summary = recorder.finish()

    assert summary["status"] == "degraded"
    assert summary["bmta"] == 0.7 and summary["bmta_round"] == 15 and summary["final_accuracy"] == 0.7
    assert summary["evaluated_rounds"] == 2
    assert (summary["short_evaluated_rounds"], summary["short_evaluated_since"]) == (2, 10)
    assert (summary["short_training_rounds"], summary["short_training_since"]) == (1, 6)
    assert (summary["federation_clients"], summary["min_clients_evaluated"]) == (12, 10)
    assert json.loads((tmp_path / "summary.json").read_text()) == json.loads(json.dumps(summary))
    # every round is in metrics.jsonl, counted or not
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows if r["phase"] == "evaluate"] == [5, 10, 15, 20]

    short = [line for line in lines if "not counted" in line and "round" in line and "/20" in line]
    assert len(short) == 2 and short[0].endswith("[1 of 12 clients evaluated, fewer than 10: not counted]")
    assert "best 0.6000" in short[0]  # the short round's 1.0 is not the best so far
    assert any(line.startswith("flower-pfl: run degraded: 20 rounds in ") for line in lines)
    assert "  not counted    2 evaluated rounds from round 10 reached fewer than 10 of 12 clients" in lines
    assert any(line.startswith("  short rounds   1 training round from round 6: ") for line in lines)


def test_rounds_that_accepted_no_update_make_a_run_degraded(tmp_path):
    """Every reply refused (a diverged method's updates, or hostile ones) for some rounds: the figures of
    the rounds before stand, but the run does not end ``completed``."""
    lines: list[str] = []
    recorder = RunRecorder(tmp_path, {}, 10, log=lines.append, coverage=Coverage(clients=4, share=0.8))
    recorder.on_train(1, _train(4))
    recorder.on_evaluate(2, _evaluation(0.6, 4))
    for rnd in (3, 4, 5):
        recorder.on_train(rnd, _train(0, rejected=4))  # replies all came back: not short of clients
    recorder.on_evaluate(10, _evaluation(0.5, 4))
    summary = recorder.finish()
    assert summary["status"] == "degraded" and (summary["idle_rounds"], summary["idle_since"]) == (3, 3)
    assert summary["short_training_rounds"] == 0 and summary["bmta"] == 0.6
    assert any(line.startswith("flower-pfl: run degraded: 10 rounds in ") and line.endswith("some of them without an accepted update")
               for line in lines)
    assert any(line.startswith("  idle rounds    3 training rounds from round 3 accepted no update") for line in lines)
    resumed = RunRecorder.resume(tmp_path, 10, last_round=4, elapsed=1.0, log=lambda _: None)
    assert resumed.idle == [3, 4] and resumed.idle_rounds == 2


def test_a_run_whose_every_evaluation_fell_short_fails_and_says_why(tmp_path):
    recorder = RunRecorder(tmp_path, {}, 10, log=lambda _: None, coverage=Coverage(clients=12, share=0.5))
    recorder.on_evaluate(5, _evaluation(1.0, 1))
    recorder.on_evaluate(10, _evaluation(0.5, 5))
    summary = recorder.finish()
    assert summary["status"] == "failed" and "bmta" not in summary
    assert summary["error"].startswith("no evaluated round reached 6 of the 12 clients (min-evaluated-share 0.5)")


def test_a_full_run_stays_completed_and_share_zero_counts_everything(tmp_path):
    full = RunRecorder(tmp_path / "a", {}, 5, log=lambda _: None, coverage=Coverage(clients=4, share=0.8))
    full.on_train(1, _train(4))
    full.on_evaluate(5, _evaluation(0.5, 4))
    assert full.finish()["status"] == "completed"
    lax = RunRecorder(tmp_path / "b", {}, 5, log=lambda _: None, coverage=Coverage(clients=4, share=0.0))
    lax.on_train(1, _train(1, failed=3))
    lax.on_evaluate(5, _evaluation(0.5, 1))
    summary = lax.finish()
    assert summary["status"] == "completed" and summary["bmta"] == 0.5 and summary["short_evaluated_rounds"] == 0


def test_resume_counts_the_rows_already_written_the_same_way(tmp_path):
    coverage = Coverage(clients=12, share=0.8)
    first = RunRecorder(tmp_path, {}, 20, log=lambda _: None, coverage=coverage)
    first.on_train(5, _train(12))
    first.on_evaluate(5, _evaluation(0.6, 12))
    first.on_train(10, _train(3, failed=9))
    first.on_evaluate(10, _evaluation(1.0, 1))
    first.on_train(15, _train(12))
    first.on_evaluate(15, _evaluation(0.8, 12))  # after the checkpoint: dropped on resume
    resumed = RunRecorder.resume(tmp_path, 20, last_round=10, elapsed=1.0, log=lambda _: None, coverage=coverage)
    assert [e["round"] for e in resumed.evaluations] == [5]
    assert resumed.short_evaluations == [10] and resumed.short_trainings == [10]
    resumed.on_evaluate(20, _evaluation(0.7, 12))
    summary = resumed.finish()
    assert summary["status"] == "degraded" and summary["bmta"] == 0.7 and summary["short_evaluated_since"] == 10


def test_the_closing_block_of_a_degraded_run_by_hand():
    summary = {"status": "degraded", "num_rounds": 30, "wall_time_s": 90, "seconds_per_round": 3.0,
               "short_evaluated_rounds": 1, "short_evaluated_since": 25, "min_clients_evaluated": 8,
               "federation_clients": 10, "bmta": 0.5, "bmta_round": 20, "bmta_weighted": 0.5,
               "last10_mean_accuracy": 0.5, "last10_mean_accuracy_weighted": 0.5, "final_accuracy": 0.5,
               "final_accuracy_std": 0.0}
    assert summary_lines(summary, "/r")[:2] == [
        "flower-pfl: run degraded: 30 rounds in 1:30, 3.00 s/round, some of them short of clients",
        "  not counted    1 evaluated round from round 25 reached fewer than 8 of 10 clients",
    ]


@pytest.mark.parametrize("value", [-0.1, 1.5])
def test_min_evaluated_share_outside_zero_one_is_refused(value):
    with pytest.raises(ConfigError, match="'min-evaluated-share' = .* must be a share in \\[0, 1\\]"):
        ExperimentConfig(min_evaluated_share=value)


def test_sweeps_and_tables_take_no_run_short_of_clients(tmp_path):
    """A cell degraded by short rounds is retried by the sweep (the reason says why) and left out of
    compare's tables; one degraded by idle rounds alone keeps its figures."""
    cell = Cell("fedavg", "base", 0, {"method": "fedavg", "num-rounds": 3}, 10, tmp_path / "cell")
    run = cell.folder / "run-1"
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(cell.run_config))
    degraded = {"status": "degraded", "bmta": 0.9, "short_evaluated_rounds": 2, "short_training_rounds": 5}
    (run / "summary.json").write_text(json.dumps(degraded))
    assert finished(cell) is None
    assert unfinished_reason(cell) == "run degraded: 2 evaluated and 5 training rounds short of clients"
    assert compare.load([run]) == [] and compare.completed({**degraded, "status": "completed"})
    # idle rounds alone (every reply came back and was refused): the run's own figures, kept, not retried
    idle = {"status": "degraded", "bmta": 0.4, "short_evaluated_rounds": 0, "short_training_rounds": 0, "idle_rounds": 4}
    (run / "summary.json").write_text(json.dumps(idle))
    assert finished(cell) == run and compare.completed(idle)
    assert not compare.completed({**idle, "short_training_rounds": 1})  # short of clients as well: retried
    assert not compare.completed({k: v for k, v in idle.items() if k != "bmta"})  # no figure at all
