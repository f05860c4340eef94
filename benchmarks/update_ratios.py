"""How close honest training comes to the server's update bound (``max-update-ratio``).

Runs every method on the Synthetic benchmark (FedMCSA's Table 1 settings, MLR and DNN) with the
default bounds and prints, per method, the largest ``update-bound-use`` of any reply: how much of the
default bound it used (1 = at the bound): its model's change over 10 times the norm of the model it
was sent, or its extras (SCAFFOLD's Δc_i, FedAttn's Z_i) over 100 times the round's median. Figures
well below 1, and no refused reply, mean the default bounds do not change a published number.

    python -m benchmarks.update_ratios --rounds 30 --workers 2
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.common import machine, run_jobs
from benchmarks.fedmcsa_table1 import PAPER_SETTINGS, _method_config
from flower_pfl.experiment.config import ConfigError, ExperimentConfig
from flower_pfl.methods.registry import entries


def _valid(overrides: dict) -> bool:
    """Whether the run config is one the method accepts (FedPer needs a model with more than a head)."""
    try:
        ExperimentConfig.from_mapping({**ExperimentConfig().to_run_config(), **overrides})
        return True
    except ConfigError:
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--models", nargs="+", default=["mlr", "dnn"])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--output-dir", default="results/update_ratios")
    args = ap.parse_args()
    labels = [e.label for e in entries()]
    jobs = [{"label": label, "model": model, "num_nodes": 100,
             "overrides": {**PAPER_SETTINGS, **_method_config(label), "model": model, "num-rounds": args.rounds,
                           "eval-every": args.rounds, "output-dir": args.output_dir}}
            for model in args.models for label in labels]
    jobs = [job for job in jobs if _valid(job["overrides"])]
    runs = run_jobs(jobs, args.workers, lambda r: f"{r['label']} / {r['model']}")
    print(f"\nLargest share of the default update bounds used over {args.rounds} rounds ({machine(args.workers)}):\n")
    print("| method | " + " | ".join(args.models) + " |\n|---|" + "---|" * len(args.models))
    largest, refused = 0.0, 0
    for label in labels:
        cells = []
        for model in args.models:
            found = [r for r in runs if r["label"] == label and r["model"] == model]
            if not found:
                cells.append("-")
                continue
            rows = [json.loads(x) for x in (Path(found[0]["results_dir"]) / "metrics.jsonl").read_text().splitlines()]
            train = [r for r in rows if r["phase"] == "train"]
            ratio = max((r.get("update-bound-use", 0.0) for r in train), default=0.0)
            refused += int(sum(r.get("clients-rejected", 0) for r in train))
            largest = max(largest, ratio)
            cells.append(f"{ratio:.3f}")
        print(f"| {label} | " + " | ".join(cells) + " |")
    print(f"\nlargest: {largest:.3f}; replies refused: {refused}")


if __name__ == "__main__":
    main()
