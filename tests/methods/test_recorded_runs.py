"""The recording itself (``runs.py``): every registry entry is recorded, Flower's built-ins that other
methods are compared with are run again like any method, no two recordings are the same run, and
every entry's run with its round's clients trained as one computation (``flower_pfl.engine.batched``)
gives the recorded figures (its clients' one-by-one run's) within the tolerance of reordered float
sums, or says why it trained them one by one."""

from __future__ import annotations

import json

import pytest

from flower_pfl.engine.batched import unbatched
from flower_pfl.experiment.config import ExperimentConfig
from flower_pfl.experiment.models import build_model
from flower_pfl.methods.registry import entries

from .runs import CURVES, RECORDED, assert_as_recorded, model_for, short_run

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



def _unbatched_because(label: str) -> str | None:
    """Why the entry's clients train one by one (``None``: they train as one computation)."""
    e = next(e for e in entries() if e.label == label)
    if e.builtin:  # Flower's strategies: plain SGD, or FedProx's proximal term
        return None
    method = e.declaration(**e.arguments(ExperimentConfig(**{}).to_run_config()))
    return unbatched(method.client_algorithm(), build_model(model_for(label), (60,), 10))


@pytest.mark.parametrize("label", [e.label for e in entries()])
def test_clients_trained_as_one_computation_give_the_recorded_figures(label, tmp_path):
    run = short_run(label, tmp_path, **{"batch-clients": True})
    summary = json.loads((run["folder"] / "summary.json").read_text())
    why = _unbatched_because(label)
    if why is None:  # every training of the run as one computation
        assert summary["clients_trained_one_by_one"] == 0 and summary["clients_trained_together"] == 6 * 6, summary
    else:  # one by one, and the summary says why
        assert summary["clients_trained_together"] == 0 and any(why in r for r in summary["one_by_one_because"]), summary
    # evaluations together too, but kNN-Per's: its model mixes in each client's own training set
    assert summary["clients_evaluated_together"] == (0 if label == "knnper" else 3 * 12), summary  # rounds 1, 3, 6
    assert_as_recorded(label, run)  # the one-by-one run's figures, within the tolerance of reordered float sums
