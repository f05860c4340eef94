import tomllib
from pathlib import Path

import numpy as np
import pytest

from flower_pfl.config import ConfigError, ExperimentConfig
from flower_pfl.data import generate_synthetic, train_test_split
from flower_pfl.metrics import round_metrics, summarize_run, weighted_means

ROOT = Path(__file__).resolve().parents[1]


def test_synthetic_shapes_sizes_and_determinism():
    users = generate_synthetic(0.5, 0.5, num_users=20, seed=3)
    assert len(users) == 20
    for x, y in users:
        assert x.dtype == np.float32 and x.shape[1] == 60 and y.dtype == np.int64
        assert len(x) == len(y) and len(y) >= 250 and len(y) % 5 == 0
        assert y.min() >= 0 and y.max() < 10
    again = generate_synthetic(0.5, 0.5, num_users=20, seed=3)
    assert all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) for a, b in zip(users, again))
    other = generate_synthetic(0.5, 0.5, num_users=20, seed=4)
    assert not np.array_equal(users[0][1][:50], other[0][1][:50]) or len(users[0][1]) != len(other[0][1])


def test_synthetic_labels_follow_a_per_user_linear_model():
    """y = argmax(x W_i + b_i): a linear classifier fits each user's own data (nearly) perfectly."""
    x, y = generate_synthetic(0.5, 0.5, num_users=3, seed=0)[0]
    xb = np.hstack([x, np.ones((len(x), 1))]).astype(np.float64)
    onehot = np.eye(10)[y]
    w, *_ = np.linalg.lstsq(xb, onehot, rcond=None)
    assert (np.argmax(xb @ w, 1) == y).mean() > 0.75


def test_split_is_seeded_disjoint_and_covers_everything():
    x = np.arange(40, dtype=np.float32).reshape(20, 2)
    y = np.arange(20)
    a = train_test_split(x, y, 0.75, np.random.default_rng(0))
    b = train_test_split(x, y, 0.75, np.random.default_rng(0))
    assert a.num_train == 15 and a.num_test == 5
    assert sorted(a.y_train.tolist() + a.y_test.tolist()) == list(range(20))
    assert a.y_train.tolist() == b.y_train.tolist()
    with pytest.raises(ValueError):
        train_test_split(x, y, 1.0, np.random.default_rng(0))


def test_round_metrics_by_hand():
    m = round_metrics([{"accuracy": 1.0, "loss": 0.2}, {"accuracy": 0.5, "loss": 0.4}], [10, 30])
    assert m["accuracy-mean"] == 0.75 and m["accuracy-min"] == 0.5
    assert m["accuracy"] == pytest.approx((10 + 15) / 40)  # sample-weighted, as Flower names it
    assert m["accuracy-std"] == pytest.approx(0.25)
    assert m["loss"] == pytest.approx((2 + 12) / 40) and "loss-mean" not in m
    assert m["clients-evaluated"] == 2


def test_weighted_means_are_flowers_where_every_client_reports_every_metric():
    from flwr.app import MetricRecord, RecordDict
    from flwr.serverapp.strategy.strategy_utils import aggregate_metricrecords

    rows = [{"eval-acc": 0.9, "eval-loss": 0.3, "hist": [1.0, 2.0], "n": 5}, {"eval-acc": 0.4, "eval-loss": 1.1, "hist": [3.0, 0.0], "n": 15}]
    flower = aggregate_metricrecords([RecordDict({"m": MetricRecord(r)}) for r in rows], "n")
    ours = weighted_means(rows, [5, 15], skip=("n",))
    assert set(ours) == set(flower) == {"eval-acc", "eval-loss", "hist"}
    for key in ours:
        assert np.allclose(ours[key], flower[key])


def test_weighted_means_average_each_metric_over_the_clients_that_report_it():
    rows = [{"a": 1.0, "b": float("nan"), "s": "text"}, {"a": 0.0, "b": 2.0, "c": [1.0]}, {"a": 0.5, "c": [1.0, 2.0], "d": True}]
    out = weighted_means(rows, [1, 3, 4])
    assert out["a"] == pytest.approx((1 + 0 + 2) / 8)
    assert out["b"] == 2.0  # NaN left out, not the whole metric
    assert "c" not in out and "s" not in out and "d" not in out  # lists of two lengths, a string, a bool


def test_summary_bmta_and_last_ten_percent():
    hist = [{"round": r, "accuracy-mean": a, "accuracy": w, "accuracy-std": 0.0}
            for r, a, w in [(10, 0.5, 0.4), (50, 0.9, 0.7), (90, 0.8, 0.8), (95, 0.7, 0.6), (100, 0.6, 0.9)]]
    s = summarize_run(hist, num_rounds=100)
    assert s["bmta"] == 0.9 and s["bmta_round"] == 50 and s["bmta_weighted"] == 0.9
    assert s["last10_mean_accuracy"] == pytest.approx(0.65)  # rounds 95 and 100 are in (90, 100]
    assert s["final_accuracy"] == 0.6


def test_config_errors_name_the_key_and_the_allowed_values():
    for override, fragment in [
        ({"method": "fedfoo"}, "'method'.*one of .*fedmcsa"),
        ({"fedattn-k": 0}, "'fedattn-k'.*>= 1"),
        ({"igfl-attention": "all"}, "'igfl-attention'.*self, global, time"),
        ({"aggregation": "mcsa"}, "'aggregation'.*for method 'fedmcsa'"),
        ({"method": "fedamp", "fedamp-alpha-k": 0.5}, "'fedamp-alpha-k'.*self weight"),
        ({"sigma": 0}, "'sigma'.*> 0"),
        ({"lam": -1.0}, "'lam'.*>= 0"),
        ({"num-rounds": 0}, "'num-rounds'.*>= 1"),
        ({"train-fraction": 1.5}, "'train-fraction'"),
        ({"local-steps": "many"}, "'local-steps'.*int"),
        ({"clients-per-round": True}, "'clients-per-round'"),
    ]:
        with pytest.raises(ConfigError, match=fragment):
            ExperimentConfig.from_mapping(override)
    assert ExperimentConfig.from_mapping({"lr": 1}).lr == 1.0


def test_pyproject_run_config_matches_the_defaults():
    app_config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    assert app_config == ExperimentConfig().to_run_config()
