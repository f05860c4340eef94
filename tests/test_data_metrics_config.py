import tomllib
import warnings
from pathlib import Path

import numpy as np
import pytest

from flower_pfl.engine.client_metrics import round_metrics, weighted_means
from flower_pfl.experiment.config import NOT_SET, ConfigError, ExperimentConfig
from flower_pfl.experiment.data import generate_synthetic, train_test_split
from flower_pfl.experiment.declared import with_declared_blocks
from flower_pfl.methods.registry import renamed_keys
from flower_pfl.run.summary import summarize_run

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
    assert a.num_train == 15 and len(a.y_test) == 5
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

    from client_apps.flower_internals import aggregate_metricrecords

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
        ({"fedmcsa-sigma": 0}, "'fedmcsa-sigma'.*> 0"),
        ({"fedmcsa-lambda": -1.0}, "'fedmcsa-lambda'.*>= 0"),
        ({"num-rounds": 0}, "'num-rounds'.*>= 1"),
        ({"train-fraction": 1.5}, "'train-fraction'"),
        ({"local-steps": "many"}, "'local-steps'.*int"),
        ({"clients-per-round": True}, "'clients-per-round'"),
    ]:
        with pytest.raises(ConfigError, match=fragment):
            ExperimentConfig.from_mapping(override)
    assert ExperimentConfig.from_mapping({"lr": 1}).lr == 1.0


def test_pyproject_holds_the_keys_the_declarations_make():
    text = (ROOT / "pyproject.toml").read_text()
    assert with_declared_blocks(text) == text, "pyproject.toml's declared keys are stale: run `python -m tests.regenerate`"


def test_pyproject_run_config_matches_the_defaults():
    app_config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    renamed = {old: app_config.pop(old) for old in renamed_keys()}
    assert app_config == ExperimentConfig().to_run_config()
    assert renamed == dict.fromkeys(renamed_keys(), NOT_SET)  # Flower accepts only listed keys: the old names, not set


@pytest.mark.parametrize("old,new,value", [("lam", "fedmcsa-lambda", 3.0), ("sigma", "fedmcsa-sigma", 7.0),
                                           ("layer-grouping", "fedmcsa-layer-grouping", "module"),
                                           ("proximal-mu", "fedprox-mu", 0.5), ("server-momentum", "fedavgm-momentum", 0.5)])
def test_renamed_method_keys_are_still_read_with_a_warning(old, new, value):
    defaults = ExperimentConfig().to_run_config()
    with pytest.warns(FutureWarning, match=f"'{old}' is now '{new}'"):
        cfg = ExperimentConfig.from_mapping({**defaults, old: value})  # as under flwr run: every key present
    assert cfg.option(new) == value and old not in cfg.to_run_config()
    with pytest.warns(FutureWarning):
        assert ExperimentConfig(options={old: value}).option(new) == value
    if isinstance(value, float):  # both names set, to different values (the new one not at its default)
        with pytest.raises(ConfigError, match=f"set only '{new}'"):
            ExperimentConfig.from_mapping({**defaults, old: value, new: 0.25})


def test_an_unset_renamed_key_in_pyproject_is_silent():
    app_config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ExperimentConfig.from_mapping(app_config) == ExperimentConfig()
