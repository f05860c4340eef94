"""Short whole runs of every method, compared with recorded figures.

``recorded.json`` holds, for every ``(method, aggregation)``, the summary of one short
in-process run (the real ServerApp and ClientApp code, Message API). A method's test runs
it again and compares: any change to what the method computes shows up here. After a
deliberate change, re-record with ``python -m tests.methods.runs`` and say why in the commit.
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

from server_apps.inprocess import run_in_process

RECORDED = Path(__file__).with_name("recorded.json")
#: 12 clients of Synthetic(0.5, 0.5), 6 of them per round, the DNN (every method has a layer to share), 6 rounds
SETTING = {"num-rounds": 6, "clients-per-round": 6, "local-steps": 5, "eval-every": 3, "seed": 0, "model": "dnn"}
NUM_NODES = 12
#: the figures compared (accuracy as a fraction)
FIGURES = ("bmta", "bmta_weighted", "last10_mean_accuracy", "final_accuracy")


def short_run(label: str, out_dir: str | Path, **overrides: Any) -> dict[str, Any]:
    """The summary of ``label``'s (``fedavg`` or ``fedavg+mcsa``) short run."""
    method, _, aggregation = label.partition("+")
    folder = run_in_process({**SETTING, "method": method, "aggregation": aggregation or "default", "output-dir": str(out_dir),
                             **overrides}, num_nodes=NUM_NODES)
    return json.loads((folder / "summary.json").read_text())


def assert_as_recorded(label: str, summary: dict[str, Any], tol: float = 1e-6) -> None:
    """``summary``'s figures equal the recorded ones (within ``tol``, float noise across machines)."""
    recorded = json.loads(RECORDED.read_text())[label]
    for key in FIGURES:
        assert math.isclose(summary[key], recorded[key], abs_tol=tol), (label, key, summary[key], recorded[key])


def record() -> None:
    from flower_pfl.methods.registry import entries

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for e in entries():
            summary = short_run(e.label, tmp)
            out[e.label] = {k: summary[k] for k in FIGURES}
            print(e.label, out[e.label], file=sys.stderr)
    RECORDED.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    record()
