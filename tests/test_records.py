"""Flower's records made with their checks done once per value: the same records Flower's constructors make,
and Flower's own errors for what they refuse."""

from __future__ import annotations

import re

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from strategies.records import config_record, merged, metric_record, record_dict, records

METRICS = [{}, {"loss": 0.5, "num-examples": 12}, {"per-class": [1.0, 2.0], "counts": [1, 2], "none": []},
           {"numpy": np.float64(0.25)}]
CONFIGS = [{}, {"lr": 0.1, "steps": 3, "name": "fedavg", "raw": b"\x00", "flag": True},
           {"names": ["a", "b"], "flags": [True, False], "blobs": [b"x"], "none": []}]


def _same(ours, flowers) -> None:
    assert type(ours) is type(flowers) and ours == flowers and vars(ours).keys() == vars(flowers).keys()
    assert list(ours.items()) == list(flowers.items())  # the same entries, in the same order


@pytest.mark.parametrize("values", METRICS)
def test_a_metric_record_is_flowers(values):
    _same(metric_record(values), MetricRecord(dict(values)))


@pytest.mark.parametrize("values", CONFIGS)
def test_a_config_record_is_flowers(values):
    _same(config_record(values), ConfigRecord(dict(values)))


def test_a_record_dict_is_flowers_and_holds_the_records_given():
    given = {"arrays": ArrayRecord({"w": Array(np.ones(2, np.float32))}), "metrics": MetricRecord({"a": 1.0}),
             "config": ConfigRecord({"b": "c"})}
    ours = record_dict(given)
    _same(ours, RecordDict(dict(given)))
    assert all(ours[name] is record for name, record in given.items())
    assert records(ours, MetricRecord) == {"metrics": given["metrics"]} and merged(ours, ConfigRecord) == {"b": "c"}


@pytest.mark.parametrize(("make", "flowers", "values"), [
    (metric_record, MetricRecord, {"flag": True}),  # a bool is no metric
    (metric_record, MetricRecord, {"name": "x"}),
    (metric_record, MetricRecord, {"list": [1.0, "x"]}),
    (metric_record, MetricRecord, {"mixed": [1, 2.0]}),
    (config_record, ConfigRecord, {"mixed": [1, "a"]}),
    (metric_record, MetricRecord, {3: 1.0}),
    (config_record, ConfigRecord, {"nested": [[1]]}),
    (config_record, ConfigRecord, {"dict": {"a": 1}}),
    (record_dict, RecordDict, {"metrics": {"a": 1.0}}),
])
def test_what_flower_refuses_is_refused_with_flowers_own_error(make, flowers, values):
    with pytest.raises(TypeError) as flowers_error:
        flowers(dict(values))
    with pytest.raises(TypeError, match=re.escape(str(flowers_error.value))):
        make(values)
