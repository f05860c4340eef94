"""What the figures show: the learning curve's band, client grouping, heatmap colour scales, titles
and the results folder's name."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pytest

from flower_pfl.experiment.config import ExperimentConfig
from flower_pfl.reports.figures import (
    client_accuracies,
    draw_client_matrix,
    draw_selection_mask,
    group_boundaries,
    group_spans,
    grouped_order,
    method_settings,
    new_figure,
    run_title,
    spread_band,
)

EVALS = [{"round": 1, "accuracy-mean": 0.3, "accuracy-std": 0.5}, {"round": 3, "accuracy-mean": 0.9, "accuracy-std": 0.2}]


def test_band_is_the_10th_to_90th_percentile_of_the_clients():
    per_client = {1: [0.0, 0.5, 1.0, 1.0, 1.0], 3: [0.8, 0.9]}
    lo, hi, label = spread_band(EVALS, per_client)
    # round 1: position 0.4 between 0.0 and 0.5 -> 0.2; position 3.6 between 1.0 and 1.0 -> 1.0
    # round 3: 0.8 + 0.1 * 0.1 = 0.81 and 0.8 + 0.9 * 0.1 = 0.89
    assert np.allclose(lo, [0.2, 0.81]) and np.allclose(hi, [1.0, 0.89])
    assert label == "10th–90th percentile over clients"


@pytest.mark.parametrize("per_client", [None, {}, {1: [0.1, 0.2]}])  # no clients.jsonl, or a round without rows
def test_band_falls_back_to_std_clipped_to_the_unit_interval_and_says_so(per_client):
    lo, hi, label = spread_band(EVALS, per_client)
    assert np.allclose(lo, [0.0, 0.7]) and np.allclose(hi, [0.8, 1.0])  # 0.3 - 0.5 and 0.9 + 0.2 clipped
    assert "clipped to [0, 1]" in label


def test_client_accuracies_by_round_skip_rows_without_a_finite_accuracy():
    rows = [{"round": 2, "accuracy": 0.5}, {"round": 2, "accuracy": 1}, {"round": 2, "accuracy": math.nan},
            {"round": 4, "loss": 0.3}, {"round": 4, "accuracy": 0.25}]
    assert client_accuracies(rows) == {2: [0.5, 1.0], 4: [0.25]}


def test_grouped_order_puts_each_group_together_by_tiebreak():
    groups = [(1, 2), (0,), (1, 2), (0,), (3,)]
    assert grouped_order(groups, tiebreak=[9, 5, 1, 2, 0]) == [3, 1, 2, 0, 4]
    assert grouped_order([2, 1, 2, 1]) == [1, 3, 0, 2]  # ties keep their original order


def test_group_spans_and_separators():
    groups = ["a", "a", "b", "c", "c", "c"]
    assert group_spans(groups) == [(0, 2, "a"), (2, 3, "b"), (3, 6, "c")]
    assert group_boundaries(groups) == [1.5, 2.5]
    assert group_boundaries(["a", "a"]) == [] and group_spans([]) == []


def test_heatmap_scale_leaves_out_the_diagonal_and_names_groups():
    fig, (ax,) = new_figure(1)
    matrix = np.array([[0.9, 0.1, np.nan], [0.3, 0.6, 0.1], [np.nan, 0.2, 0.8]])
    missing = draw_client_matrix(fig, ax, matrix, "mean attention weight", groups=[(0, 1), (0, 1), (2,)])
    image = ax.images[0]
    assert missing and image.get_clim() == (0.1, 0.3)  # off-diagonal range; the diagonal's 0.9 is not in it
    assert image.get_array().mask.diagonal().all()
    assert fig.axes[-1].get_ylabel() == "mean attention weight"  # the colour bar
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0,1", "2"] and list(ax.get_xticks()) == [0.5, 2.0]
    horizontal, vertical = ax.lines  # the separator between the groups
    assert horizontal.get_ydata()[0] == 1.5 and vertical.get_xdata()[0] == 1.5
    assert not draw_client_matrix(fig, ax, np.eye(2), "x")  # every pair met
    plt.close(fig)


def test_selection_mask_uses_two_colours():
    fig, (ax,) = new_figure(1)
    draw_selection_mask(ax, np.array([[True, False], [True, True]]), groups=[0, 1])
    image = ax.images[0]
    assert image.get_cmap().N == 2 and image.norm(0) == 0 and image.norm(1) == 1
    assert image.get_array()[1, 0] == 1 and image.get_array()[0, 1] == 0 and image.get_array().mask.diagonal().all()
    plt.close(fig)


def test_title_names_method_settings_data_seed_and_api():
    cfg = ExperimentConfig(method="fedattn", api="legacy", partition="pathological", classes_per_client=3, seed=4,
                           clients_per_round=5, options={"fedattn-k": 7})
    head, tail = run_title(cfg, num_nodes=12).splitlines()
    assert head.startswith("fedattn (fedattn-k=7, fedattn-dk=16, fedattn-lr=0.01,") and "fedattn-learn-values=true" in head
    assert "pathological partition (classes-per-client=3)" in tail and "5 of 12 clients per round" in tail
    assert "seed 4" in tail and tail.endswith("legacy API")
    assert run_title(ExperimentConfig(method="fedavg")).splitlines()[0] == "fedavg"


def test_method_settings_are_the_keys_its_strategy_reads_and_what_the_variant_fixes():
    cfg = ExperimentConfig(method="fedavg", aggregation="mcsa", options={"fedmcsa-sigma": 10.0})
    assert method_settings(cfg) == {"fedmcsa-sigma": 10.0, "fedmcsa-layer-grouping": "tensor", "all-clients-train": False, "lam": 0.0}
    assert method_settings(ExperimentConfig(method="fedacs", options={"fedacs-p": 0.3})) == {"fedacs-p": 0.3, "all-clients-train": False}


def test_results_folder_name_tells_the_api_apart(tmp_path):
    from server_apps.app import run_dir

    message = ExperimentConfig(method="fedavg", seed=2, output_dir=str(tmp_path))
    legacy = ExperimentConfig(method="fedavg", seed=2, api="legacy", output_dir=str(tmp_path))
    assert message.run_name == "fedavg-synthetic-mlr-seed2" and legacy.run_name == "fedavg-legacy-synthetic-mlr-seed2"
    assert run_dir(legacy).name.startswith("fedavg-legacy-synthetic-mlr-seed2-")
    assert ExperimentConfig(method="fedavg", aggregation="mcsa", api="legacy").run_name.startswith("fedavg+mcsa-legacy-")


def test_benchmark_caption_keeps_shared_settings_and_lists_seeds():
    from benchmarks.common import caption

    runs = [{"overrides": {"dataset": "synthetic", "method": m, "lr": 0.02, "seed": s, "output-dir": "/x", "fedattn-k": 5}}
            for m, s in (("fedattn", 1), ("fedavg", 0))]
    runs[1]["overrides"].pop("fedattn-k")
    assert caption(runs) == "dataset=synthetic, lr=0.02; each line the mean over seeds 0, 1; markers: evaluated rounds"
    assert "one line per seed (0, 1)" in caption(runs, per_seed=True)
