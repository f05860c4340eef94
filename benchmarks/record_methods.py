"""Record every method's short in-process run, in both Flower APIs, as JSON.

Every train and evaluation row of ``metrics.jsonl`` (timings left out) and each client's
evaluation fingerprint, so two versions of the package can be compared number for number::

    python benchmarks/record_methods.py --out before.json
    python benchmarks/record_methods.py --out after.json --compare before.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flower_pfl.methods.registry import entries
from server_apps.inprocess import run_in_process

#: (method, aggregation) of every registry entry
RUNS = [(e.method, e.aggregation) for e in entries()]
#: the clients train one by one (the path of ``flwr run``); ``--batch-clients`` records them as one computation
SETTING = {"num-rounds": 6, "clients-per-round": 6, "local-steps": 5, "eval-every": 3, "seed": 0, "model": "dnn",
           "batch-clients": False}
NUM_NODES = 12


def record(runs: list[tuple[str, str]], apis: list[str], overrides: dict) -> dict[str, list[dict]]:
    torch.set_num_threads(1)  # as the tests run: one thread's sums, the same on every machine with the same kernels
    out: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for api in apis:
            for method, aggregation in runs:
                folder = run_in_process({**SETTING, **overrides, "method": method, "aggregation": aggregation, "api": api,
                                         "output-dir": tmp}, num_clients=NUM_NODES)
                rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
                clients = [json.loads(line) for line in (folder / "clients.jsonl").read_text().splitlines()]
                for row in rows:
                    row.pop("elapsed_s", None)
                out[f"{method}+{aggregation}/{api}"] = rows + [
                    {"round": c["round"], "partition-id": c["partition-id"], "fingerprint": c.get("model-fingerprint")}
                    for c in clients]
                print(f"{method}+{aggregation}/{api}: {rows[-1].get('accuracy-mean')}", flush=True)
    return out


def compare(now: dict, before: dict) -> int:
    differ = 0
    for key, rows in before.items():
        if now.get(key) == rows:
            print(f"same      {key}")
            continue
        differ += 1
        worst = max((abs(a[k] - b[k]) for a, b in zip(now.get(key, []), rows) for k in b
                     if isinstance(b[k], float) and k in a), default=float("nan"))
        print(f"DIFFERENT {key}: largest metric difference {worst:.3g}")
    return differ


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--compare", type=Path)
    parser.add_argument("--api", nargs="+", default=["message", "legacy"])
    parser.add_argument("--full-participation", action="store_true", help="every node trains every round")
    parser.add_argument("--batch-clients", action="store_true", help="a round's clients as one computation")
    args = parser.parse_args()
    extra = {"clients-per-round": NUM_NODES} if args.full_participation else {}
    extra |= {"batch-clients": True} if args.batch_clients else {}
    result = record(RUNS, args.api, extra)
    args.out.write_text(json.dumps(result, indent=1))
    if args.compare:
        sys.exit(1 if compare(result, json.loads(args.compare.read_text())) else 0)
