"""FedACS's data-scarce setting (Chen, Li, Shen, Table 2): 100 clients, Dirichlet(alpha) label
skew, only 50 training samples per client.

Runs FedACS, FedAvg, Local and FedMCSA for every alpha and seed with the real
ServerApp/ClientApp code in-process, and prints mean ± std over seeds of BMTA (mean
personalized test accuracy over clients, best round), with the paper's FedACS
numbers beside where they apply (CIFAR-10, Fashion-MNIST).

    python -m benchmarks.fedacs_scarce                                   # Synthetic, ~10 min on 2 cores
    python -m benchmarks.fedacs_scarce --dataset fmnist --data-dir /data   # when the files are there
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from benchmarks.common import fmt, machine, run_jobs, save

ALPHAS = (0.1, 0.5, 1.0, 5.0, 10.0)
#: Table 2, FedACS, 50 training samples per client, alpha = 0.1 / 0.5 / 1 / 5 / 10
PAPER = {"cifar10": (81.72, 83.84, 84.97, 85.76, 85.42), "fmnist": (84.26, 84.33, 85.57, 86.13, 88.42)}
LABELS = {"fedacs": "FedACS", "fedavg": "FedAvg", "local": "Local", "fedmcsa": "FedMCSA"}
DEFAULT_MODEL = {"synthetic": "mlr", "fmnist": "cnn", "emnist": "cnn", "cifar10": "cifar-cnn"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="synthetic", choices=sorted(DEFAULT_MODEL))
    ap.add_argument("--data-dir", default="data", help="torchvision layout (data-source torchvision)")
    ap.add_argument("--data-source", default="torchvision", choices=["torchvision", "huggingface"])
    ap.add_argument("--hub-dataset", default="", help="huggingface: hub id or local folder (default: the usual hub id)")
    ap.add_argument("--model", default=None, help="default: MLR for Synthetic, the papers' CNNs for images")
    ap.add_argument("--methods", nargs="+", default=list(LABELS))
    ap.add_argument("--alphas", nargs="+", type=float, default=list(ALPHAS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--clients-per-round", type=int, default=10)
    ap.add_argument("--train-samples", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--local-steps", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=10)
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--fedacs-p", type=float, default=0.5)
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/fedacs_scarce_<dataset>")
    args = ap.parse_args()
    model = args.model or DEFAULT_MODEL[args.dataset]
    out = args.out or Path(__file__).parent / "results" / f"fedacs_scarce_{args.dataset}"

    common = {"dataset": args.dataset, "data-dir": str(Path(args.data_dir).resolve()), "model": model,
              "data-source": args.data_source, "hub-dataset": args.hub_dataset,
              "partition": "dirichlet", "train-samples-per-client": args.train_samples,
              "clients-per-round": args.clients_per_round, "num-rounds": args.rounds, "local-steps": args.local_steps,
              "batch-size": args.batch_size, "lr": args.lr, "fedacs-p": args.fedacs_p, "eval-every": args.eval_every,
              "device": "cpu", "output-dir": str(out / "runs")}
    jobs = [{"method": m, "alpha": a, "seed": s, "num_nodes": args.clients,
             "overrides": {**common, "method": m, "dirichlet-alpha": a, "seed": s}}
            for a in args.alphas for m in args.methods for s in args.seeds]
    t0 = time.time()
    runs = run_jobs(jobs, args.workers, lambda r: f"{LABELS[r['method']]:8s} alpha {r['alpha']:<4g} seed {r['seed']}")

    header = "| Method | " + " | ".join(f"α = {a:g}" for a in args.alphas) + " |\n|---|" + "---|" * len(args.alphas)
    rows = []
    for m in args.methods:
        cells = []
        for a in args.alphas:
            sel = [r["summary"]["bmta"] for r in runs if r["method"] == m and r["alpha"] == a]
            cells.append(fmt(sel))
            rows.append({"method": m, "alpha": a, "bmta": sel})
        header += f"\n| {LABELS[m]} | " + " | ".join(cells) + " |"
    paper = PAPER.get(args.dataset)
    if paper and set(args.alphas) <= set(ALPHAS):
        header += "\n| FedACS, paper | " + " | ".join(f"{paper[ALPHAS.index(a)]:.2f}" for a in args.alphas) + " |"
    note = (f"\n\n{args.dataset}, {args.clients} clients, Dirichlet(α) label skew, {args.train_samples} training samples "
            f"per client (test split untouched), {model.upper()}, {args.clients_per_round} clients per round, "
            f"T={args.rounds}, {args.local_steps} local steps of batch {args.batch_size}, η={args.lr}, FedACS p={args.fedacs_p}; "
            f"BMTA in %, mean ± std over seeds {args.seeds}, evaluated every {args.eval_every} rounds. "
            f"{machine(args.workers)}. Total {time.time() - t0:.0f} s.")
    print("\n" + header + note)
    save(out, header + note, {"settings": vars(args) | {"out": str(out), "model": model}, "rows": rows, "runs": runs})


if __name__ == "__main__":
    main()
