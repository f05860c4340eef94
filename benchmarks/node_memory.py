"""Peak host memory of a run by method family and clients per node, beside FedAvg's, in process.

One family a method: the global model only (FedAvg), a head per client kept by the server (FedPer) or by the
client (FedRoD), a whole model per client kept by the client (Ditto), and whole models per client kept by the
server (FedMCSA). Each runs ``--rounds`` rounds of ``--clients-per-round`` clients with 1, 10 and 50 clients
on each of ``--nodes`` nodes, on VGG-11 (9.8 M parameters) and generated 3x32x32 images (a data set of one's
own, ``images``), in a fresh process whose peak resident memory (``ru_maxrss``) is the run's: in process, the
server and the nodes share it. Beside it, the largest ``Context`` a node's message carried (pickled, as a
simulation sends it to its Ray actor and back). A layout the machine cannot hold is refused before its first
round (``flower_pfl.experiment.footprint``): the table says so.

    python -m benchmarks.node_memory                                # docs/benchmarks/memory.md's table
    python -m benchmarks.node_memory --per-node 10 --methods fedper --model resnet34
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

#: method -> what it keeps per client, and where
FAMILIES = {"fedavg": "global model only", "fedper": "a head per client, on the server",
            "fedrod": "a head per client, on the client", "ditto": "a whole model per client, on the client",
            "fedmcsa": "a whole model per client, on the server"}
SAMPLES = 4000


def images() -> tuple[np.ndarray, np.ndarray]:
    """``SAMPLES`` generated 3x32x32 images of 10 classes (the run config's ``dataset = "benchmarks.node_memory:images"``)."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 10, SAMPLES)
    return (rng.normal(size=(SAMPLES, 3, 32, 32)).astype(np.float32) * 0.5 + y[:, None, None, None] / 10), y


def one(method: str, model: str, per_node: int, nodes: int, rounds: int, per_round: int) -> dict[str, Any]:
    """One run in this process: its peak memory, time, largest node ``Context`` and how it ended."""
    import torch

    from client_apps.app import app as client_app
    from flower_pfl.experiment.config import ConfigError, ExperimentConfig
    from server_apps.app import run_experiment
    from server_apps.inprocess import in_process_grid

    torch.set_num_threads(1)
    clients = per_node * nodes
    folder = Path(tempfile.mkdtemp(prefix="node-memory-"))  # the results and the clients' state, deleted after
    config = {**ExperimentConfig().to_run_config(), "method": method, "model": model, "dataset": "benchmarks.node_memory:images",
              "partition": "iid", "num-clients": 0 if per_node == 1 else clients, "clients-per-round": per_round,
              "num-rounds": rounds, "local-steps": 2, "batch-size": 16, "eval-every": rounds, "figures": False,
              "output-dir": str(folder / "results"), "client-state-dir": str(folder / "client-state")}
    grid = in_process_grid(client_app, nodes, config)
    started, status = time.time(), "completed"
    try:
        run_experiment(grid, config)  # type: ignore[arg-type]
    except ConfigError as err:
        status = f"refused: {err}"
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    largest = max(grid.contexts.values(), key=lambda c: len(pickle.dumps(c)))
    pickled = time.perf_counter()
    context = len(pickle.dumps(largest))  # what Ray sends to the node's actor with each of its messages, and back
    pickled = time.perf_counter() - pickled
    return {"method": method, "family": FAMILIES.get(method, ""), "model": model, "clients_per_node": per_node, "nodes": nodes,
            "clients": clients, "peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "seconds": round(time.time() - started, 1), "context_bytes": context, "context_pickle_seconds": round(pickled, 3),
            "status": status}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", nargs="+", default=list(FAMILIES))
    parser.add_argument("--per-node", nargs="+", type=int, default=[1, 10, 50])
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--model", default="vgg11")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clients-per-round", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/results/node_memory/results.json")
    parser.add_argument("--one", nargs=2, metavar=("METHOD", "PER_NODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], args.model, int(args.one[1]), args.nodes, args.rounds, args.clients_per_round)))
        return
    rows = []
    for per_node in args.per_node:
        for method in args.methods:
            cmd = [sys.executable, "-m", "benchmarks.node_memory", "--one", method, str(per_node), "--model", args.model,
                   "--nodes", str(args.nodes), "--rounds", str(args.rounds), "--clients-per-round", str(args.clients_per_round)]
            done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
            if done.returncode != 0:
                row = {"method": method, "clients_per_node": per_node, "status": f"exit {done.returncode}: {done.stderr[-300:]}"}
            else:
                row = json.loads(done.stdout.strip().splitlines()[-1])
            rows.append(row)
            print(f"{method:8s} {per_node:3d}/node  peak {row.get('peak_bytes', 0) / 2**30:6.2f} GiB  "
                  f"context {row.get('context_bytes', 0) / 2**20:8.2f} MiB ({row.get('context_pickle_seconds', 0):.2f} s)  "
                  f"{row.get('seconds', 0):6.1f} s  {row['status'][:90]}",
                  flush=True)
    load = os.getloadavg()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
                               "load_average": load, "rows": rows}, indent=1))
    print(f"load average {load[0]:.2f}; written to {out}")


if __name__ == "__main__":
    main()
