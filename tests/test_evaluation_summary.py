"""What a run's summary, console and tables report of its evaluation (docs/evaluation.md), from fabricated rows."""

from __future__ import annotations

import pytest

from flower_pfl.engine.client_metrics import round_metrics, spread
from flower_pfl.experiment.config import ConfigError, ExperimentConfig
from flower_pfl.run.progress import evaluation_lines
from flower_pfl.run.summary import rounds_to_target, summarize_run
from flower_pfl.tools.compare import Row, Run, columns, table_md


def test_the_bottom_decile_is_the_mean_of_the_worst_tenth_of_the_clients():
    ten = [0.1 * i for i in range(10)]  # 0.0 .. 0.9: the worst tenth is one client
    figures = spread(ten, "accuracy")
    assert figures["accuracy-bottom10"] == 0.0 and figures["accuracy-p10"] == pytest.approx(0.09)
    many = [0.04 * i for i in range(25)]  # ceil(2.5) = 3 worst clients: 0, 0.04, 0.08
    figures = spread(many, "accuracy")
    assert figures["accuracy-bottom10"] == pytest.approx(0.04) and figures["accuracy-p10"] == pytest.approx(0.096)
    assert spread([0.7], "accuracy")["accuracy-bottom10"] == 0.7  # at least one client
    row = round_metrics([{"accuracy": a} for a in ten], [1.0] * 10)
    assert row["accuracy-bottom10"] == 0.0 and row["accuracy-min"] == 0.0


def _row(rnd: int, test: float, **more: float) -> dict[str, float]:
    return {"round": rnd, "accuracy-mean": test, "accuracy": test - 0.05, "accuracy-std": 0.1,
            "accuracy-bottom10": test - 0.3, "accuracy-p10": test - 0.2, **more}


def test_validation_chooses_its_own_round_and_bmta_stays_chosen_on_test():
    history = [_row(1, 0.50, **{"val-accuracy-mean": 0.40}), _row(2, 0.70, **{"val-accuracy-mean": 0.65}),
               _row(3, 0.75, **{"val-accuracy-mean": 0.60}), _row(4, 0.72, **{"val-accuracy-mean": 0.65})]
    s = summarize_run(history, 4)
    assert s["bmta"] == 0.75 and s["bmta_round"] == 3  # the best test round, as before
    assert s["val_selected_round"] == 2  # the first of the two best validation rounds
    assert s["val_selected_accuracy"] == 0.70 and s["val_selected_accuracy_weighted"] == pytest.approx(0.65)
    assert s["val_selected_val_accuracy"] == 0.65
    assert s["bottom10_accuracy"] == pytest.approx(0.40) and s["p10_accuracy"] == pytest.approx(0.50)  # at round 2
    assert s["final_bottom10_accuracy"] == pytest.approx(0.42)
    assert set(s["selection"]) == {"bmta", "val_selected"}


def test_without_validation_the_summary_is_as_before_and_fairness_is_at_the_bmta_round():
    history = [_row(1, 0.5), _row(2, 0.8), _row(3, 0.6)]
    s = summarize_run(history, 3)
    assert not any(k.startswith("val_selected") for k in s) and set(s["selection"]) == {"bmta"}
    assert s["bottom10_accuracy"] == pytest.approx(0.5) and s["bmta"] == 0.8 and "unseen_accuracy" not in s
    plain = summarize_run([{k: v for k, v in r.items() if "bottom10" not in k and "p10" not in k} for r in history], 3)
    assert "bottom10_accuracy" not in plain and plain["bmta"] == 0.8  # rows of older runs


def test_new_clients_and_the_participation_gap_are_read_at_the_reported_round():
    history = [_row(1, 0.6, **{"unseen-accuracy-mean": 0.3, "unseen-accuracy": 0.35, "unseen-clients-evaluated": 4}),
               _row(2, 0.8, **{"unseen-accuracy-mean": 0.5, "unseen-accuracy": 0.45, "unseen-clients-evaluated": 4})]
    s = summarize_run(history, 2)
    assert s["unseen_accuracy"] == 0.5 and s["unseen_accuracy_weighted"] == 0.45 and s["unseen_clients"] == 4
    assert s["participation_gap"] == pytest.approx(0.3)


def test_rounds_to_target_reads_validation_where_there_is_one():
    with_val = [_row(1, 0.9, **{"val-accuracy-mean": 0.5}), _row(5, 0.9, **{"val-accuracy-mean": 0.81})]
    assert rounds_to_target(with_val, 0.8) == {"rounds_to_target": 5, "rounds_to_target_on": "validation", "target_accuracy": 0.8}
    assert rounds_to_target([_row(1, 0.5), _row(5, 0.85)], 0.8)["rounds_to_target"] == 5
    assert rounds_to_target([_row(1, 0.5)], 0.8)["rounds_to_target"] is None
    assert rounds_to_target([_row(1, 0.5)], 0.0) == {}
    assert summarize_run([_row(1, 0.5), _row(2, 0.85)], 2, target=0.8)["rounds_to_target"] == 2
    with pytest.raises(ConfigError, match="'target-accuracy' = 80.0 is invalid"):
        ExperimentConfig.from_mapping({"target-accuracy": 80.0})


def test_the_console_names_what_each_figure_was_chosen_on():
    s = summarize_run([_row(1, 0.5, **{"val-accuracy-mean": 0.6, "unseen-accuracy-mean": 0.4, "unseen-accuracy": 0.4,
                                        "unseen-clients-evaluated": 3})], 1, target=0.55)
    lines = evaluation_lines(s)
    assert lines[0].startswith("  on validation  0.5000 at round 1") and "BMTA is chosen on test" in lines[0]
    assert "bottom decile  0.2000 at that round" in lines[1]
    assert "0.4000 over 3 clients that never trained (participation gap +0.1000)" in lines[2]
    assert lines[3] == "  to 0.55        round 1 (on validation)"
    assert evaluation_lines({"bmta": 0.5}) == []


def _runs(*summaries: dict) -> list[Row]:
    return [Row("s", f"m{i}", [Run(f"m{i}", {}, summary)]) for i, summary in enumerate(summaries)]


def test_tables_show_the_evaluation_columns_only_where_runs_have_them():
    old = {"bmta": 0.8, "bmta_weighted": 0.7, "last10_mean_accuracy": 0.7, "last10_mean_accuracy_weighted": 0.7, "final_accuracy": 0.7}
    assert [key for key, _ in columns(_runs(old))] == ["bmta", "bmta_weighted", "last10_mean_accuracy",
                                                      "last10_mean_accuracy_weighted", "final_accuracy"]
    new = {**old, "val_selected_accuracy": 0.75, "bottom10_accuracy": 0.3}
    rows = _runs(old, new)
    assert [key for key, _ in columns(rows)][5:] == ["val_selected_accuracy", "bottom10_accuracy"]
    lead = table_md(rows, "val_selected_accuracy").splitlines()
    assert lead[0].startswith("| Setting | Method | chosen on validation % | BMTA % |")
    assert "| s | m0 | — | 80.00 ± 0.00 |" in lead[2] and "| s | m1 | 75.00 ± 0.00 | 80.00 ± 0.00 |" in lead[3]


def test_cost_columns_are_in_their_own_units():
    summary = {"bmta": 0.8, "bytes_total": 2_500_000.0, "train_time_per_client_round_s": 0.012}
    table = table_md(_runs(summary)).splitlines()
    assert "MB sent" in table[0] and "| 2.50 ± 0.00 | 0.01 ± 0.00 |" in table[2]
