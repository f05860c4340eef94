"""The recording itself (``runs.py``): every registry entry is recorded, Flower's built-ins that other
methods are compared with are run again like any method, and no two recordings are the same run."""

from __future__ import annotations

import json

import pytest

from flower_pfl.methods.registry import entries

from .runs import CURVES, RECORDED, assert_as_recorded

BUILTINS = [e.label for e in entries() if e.builtin]


def test_every_method_is_recorded_and_no_two_recordings_are_the_same_run():
    recorded = json.loads(RECORDED.read_text())
    assert set(recorded) == {e.label for e in entries()}, "record new methods with `python -m tests.regenerate`"
    # the continuous figures together: methods whose accuracies tie still differ here (two methods may
    # train alike and differ in what their clients evaluate: kNN-Per and Ditto train FedAvg's global model)
    seen = {tuple(tuple(figures[key]) for key in CURVES): label for label, figures in recorded.items()}
    assert len(seen) == len(recorded)


def test_builtins_include_the_reference_others_are_compared_with():
    assert {"fedavg", "fedprox", "fedavgm", "fedadam"} <= set(BUILTINS)


@pytest.mark.parametrize("label", BUILTINS)
def test_flower_builtin_short_run_as_recorded(label, short_runs):
    assert_as_recorded(label, short_runs(label))
