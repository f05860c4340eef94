"""Short whole runs of every method, compared with recorded figures.

``recorded.json`` holds, for every ``(method, aggregation)``, the figures of one short in-process
run (the real ServerApp and ClientApp code, Message API): the summary's accuracies and continuous
figures that any change to what a method computes moves (every round's training loss, and every
client's evaluation loss in every evaluated round: a continuous fingerprint of each model
evaluated). A method's test runs it again and compares. After a deliberate change, re-record with
``python -m tests.regenerate`` (it prints what moved) and say why in the commit.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from flower_pfl.engine.model_facts import ModelFacts
from flower_pfl.experiment.models import build_model
from flower_pfl.methods import registry
from flower_pfl.methods.registry import entries
from server_apps.inprocess import run_in_process
from tests.floats import isclose

RECORDED = Path(__file__).with_name("recorded.json")
#: 12 clients of Synthetic(0.5, 0.5), 6 of them per round, the DNN (every method has a layer to share; a method
#: that needs batch normalization, FedBN, its batch-normalized twin ``dnn-bn``), 6 rounds (the clients train one
#: by one, as a ``flwr run`` simulation trains them: the recording is that path's; ``test_recorded_runs`` runs
#: each entry's clients as one computation too)
SETTING = {"num-rounds": 6, "clients-per-round": 6, "local-steps": 5, "eval-every": 3, "seed": 0, "model": "dnn",
           "batch-clients": False, "figures": False}
NUM_NODES = 12
#: the summary's figures compared (accuracy as a fraction), to ``ABS_TOL``: fractions of right answers,
#: which a reordered float sum changes only where two classes' scores tie to the last bit
FIGURES = ("bmta", "bmta_weighted", "last10_mean_accuracy", "final_accuracy")
ABS_TOL = 1e-6
#: the continuous figures compared, within what reordered float32 sums allow (``tests/floats.py``: the
#: recording was made on another processor); a change to what a method computes moves them far more
CURVES = ("train_loss", "client_loss")


def model_for(label: str) -> str:
    """The short run's model of entry ``label`` (``fedavg+mcsa``): the DNN, or ``dnn-bn`` for a method that refuses it."""
    method, _, aggregation = label.partition("+")
    entry = registry.entry(method, aggregation or "default")
    return SETTING["model"] if entry.check_model(ModelFacts.of_model(build_model("dnn", (60,), 10))) is None else "dnn-bn"


def short_run(label: str, out_dir: str | Path, **overrides: Any) -> dict[str, Any]:
    """``label``'s (``fedavg`` or ``fedavg+mcsa``) short run: its summary, its ``CURVES`` and its
    results ``folder``."""
    method, _, aggregation = label.partition("+")
    folder = run_in_process({**SETTING, "model": model_for(label), "method": method, "aggregation": aggregation or "default",
                             "output-dir": str(out_dir), **overrides}, num_clients=NUM_NODES)
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    clients = sorted((json.loads(line) for line in (folder / "clients.jsonl").read_text().splitlines()),
                     key=lambda c: (c["round"], c["partition-id"]))
    return {**json.loads((folder / "summary.json").read_text()), "folder": folder,
            "train_loss": [r["train-loss"] for r in rows if r["phase"] == "train"],
            "client_loss": [c["loss"] for c in clients]}


def differences(label: str, run: dict[str, Any], recorded: dict[str, Any]) -> list[str]:
    """What of ``run`` differs from ``recorded`` beyond the tolerances."""
    out = [f"{key}: {run[key]!r} (recorded {recorded[key]!r})" for key in FIGURES
           if not math.isclose(run[key], recorded[key], rel_tol=0, abs_tol=ABS_TOL)]
    for key in CURVES:
        a, b = run[key], recorded[key]
        if len(a) != len(b) or not all(isclose(x, y) for x, y in zip(a, b)):
            out.append(f"{key}: {a} (recorded {b})")
    return [f"{label} {d}" for d in out]


def assert_as_recorded(label: str, run: dict[str, Any]) -> None:
    """``run``'s figures equal the recorded ones, within the tolerances."""
    recorded = json.loads(RECORDED.read_text())[label]
    assert not (diff := differences(label, run, recorded)), "\n".join(diff)


def record() -> None:
    """Run every registry entry and write ``recorded.json``: new entries and those that moved beyond the
    tolerances get this run's figures, the others keep their recording. Prints what moved."""
    torch.set_num_threads(1)  # as the tests run
    old = json.loads(RECORDED.read_text()) if RECORDED.exists() else {}
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["FLOWER_PFL_CLIENT_STATE_DIR"] = str(Path(tmp) / "client-state")  # nothing outside the temporary folder
        for e in entries():
            run = short_run(e.label, tmp)
            out[e.label] = {k: run[k] for k in FIGURES + CURVES}
            moved = differences(e.label, run, old[e.label]) if e.label in old and set(CURVES) <= set(old[e.label]) else \
                [f"{e.label} {k} moved" for k in FIGURES if e.label in old and not math.isclose(run[k], old[e.label][k], abs_tol=ABS_TOL)]
            if e.label in old and not moved:  # within the tolerances: the recording stays as it was
                out[e.label] = old[e.label]
            status = "recorded (new)" if e.label not in old else "unchanged" if not moved else "\n  ".join(["CHANGED", *moved])
            print(e.label, status, file=sys.stderr)
    RECORDED.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    record()
