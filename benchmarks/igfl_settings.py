"""IGFL's experiments (Huang, Shang et al., Tables 1-3 and Figure 2) on one global model.

- cross-silo: 10 clients, all train every round, 2 label shards each (sort and partition);
  IGFL-S / IGFL use time attention (the paper's choice for this setting).
- cross-device: 100 clients, 10 per round, Dirichlet(ρ) label skew for every ρ;
  IGFL-S / IGFL use global attention (the paper's choice for CIFAR-10).
- figure 2: 10 clients in twins sharing their label shards, IGFL-S with self attention;
  how often each client's strongest off-diagonal attention (averaged over rounds) falls
  on a client with the same labels (the paper reports up to 96%).

Accuracy is the global model's on the union of all clients' test splits (sample-weighted
mean over clients), averaged over the last 10% of rounds, as in the paper; mean ± std
over seeds. ``--methods local fedmcsa`` runs personalized methods in the same settings: their
figure is the same sample-weighted mean, each client using its own model.

    python -m benchmarks.igfl_settings                                   # Synthetic, ~17 min on 2 cores
    python -m benchmarks.igfl_settings --dataset cifar10 --data-dir /data  # when the files are there
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

from benchmarks.common import fmt, machine, plot_curves, run_jobs, save

METHODS = ("fedavg", "fedavgm", "scaffold", "fedadam", "igfl-c", "igfl-s", "igfl")
#: personalized methods that can run in the same settings, for comparison (each client's own model)
PERSONALIZED = ("local", "fedmcsa")
LABELS = {"fedavg": "FedAvg", "fedavgm": "FedAvgM", "scaffold": "SCAFFOLD", "fedadam": "FedAdam",
          "igfl-c": "IGFL-C", "igfl-s": "IGFL-S", "igfl": "IGFL", "local": "Local (personalized)", "fedmcsa": "FedMCSA (personalized)"}
RHOS = (1000.0, 1.0, 0.1)
#: the paper's E = 1 numbers: CIFAR-10 Tables 1 and 2 (cross-silo; ρ = 1000, 1, 0.1), EMNIST Table 3 (ρ = 1, 0.1)
PAPER = {
    "cifar10": {"fedavg": (75.89, 82.03, 75.22, 68.62), "fedavgm": (76.90, 82.21, 77.34, 70.12),
                "scaffold": (76.49, 80.99, 75.97, None),  # the paper leaves ρ = 0.1 blank for SCAFFOLD
                "fedadam": (76.29, 82.55, 76.21, 72.21), "igfl-c": (77.25, 83.56, 79.51, 78.71),
                "igfl-s": (76.17, 83.17, 79.14, 73.09), "igfl": (78.08, 84.01, 81.33, 79.45)},
    "emnist": {"fedavg": (None, None, 77.72, 70.83), "fedavgm": (None, None, 78.07, 75.37),
               "scaffold": (None, None, 78.08, 68.20), "fedadam": (None, None, 77.90, 71.17),
               "igfl-c": (None, None, 78.96, 72.61), "igfl-s": (None, None, 78.88, 74.63), "igfl": (None, None, 81.17, 77.27)},
}
DEFAULT_MODEL = {"synthetic": "mlr", "emnist": "cnn", "cifar10": "cifar-cnn"}
METRIC = "last10_mean_accuracy_weighted"


def settings(args: argparse.Namespace) -> dict[str, dict]:
    """Each setting's name -> its run-config overrides, number of clients, and attention scheme."""
    out = {"cross-silo": {"overrides": {"partition": "shards", "shards-per-client": 2, "clients-per-round": args.silo_clients},
                          "num_nodes": args.silo_clients, "attention": "time"}}
    for rho in args.rhos:
        out[f"cross-device ρ={rho:g}"] = {
            "overrides": {"partition": "dirichlet", "dirichlet-alpha": rho, "clients-per-round": args.device_clients // 10},
            "num_nodes": args.device_clients, "attention": "global"}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="synthetic", choices=sorted(DEFAULT_MODEL))
    ap.add_argument("--data-dir", default="data", help="torchvision layout")
    ap.add_argument("--emnist-split", default="byclass")
    ap.add_argument("--model", default=None, help="default: MLR for Synthetic, the papers' CNNs for images")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS + PERSONALIZED)
    ap.add_argument("--rhos", nargs="+", type=float, default=list(RHOS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--silo-clients", type=int, default=10)
    ap.add_argument("--device-clients", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=400)
    ap.add_argument("--local-steps", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=20)
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--fedadam-eta", type=float, default=0.01)
    ap.add_argument("--fedadam-tau", type=float, default=0.01, help="the paper picks τ from {0.1, 0.01}")
    ap.add_argument("--figure2-seeds", type=int, default=10, help="paired populations for the self-attention check (0: skip)")
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/igfl_<dataset>")
    args = ap.parse_args()
    model = args.model or DEFAULT_MODEL[args.dataset]
    out = args.out or Path(__file__).parent / "results" / f"igfl_{args.dataset}"

    common = {"dataset": args.dataset, "data-dir": str(Path(args.data_dir).resolve()), "emnist-split": args.emnist_split,
              "model": model, "num-rounds": args.rounds, "local-steps": args.local_steps, "batch-size": args.batch_size,
              "lr": args.lr, "fedavgm-momentum": 0.9, "fedadam-eta": args.fedadam_eta, "fedadam-tau": args.fedadam_tau,
              "eval-every": args.eval_every, "device": "cpu", "output-dir": str(out / "runs")}
    grid = settings(args)
    jobs = [{"kind": "table", "setting": name, "method": m, "seed": s, "num_nodes": st["num_nodes"],
             "overrides": {**common, **st["overrides"], "method": m, "igfl-attention": st["attention"], "seed": s}}
            for name, st in grid.items() for m in args.methods for s in args.seeds]
    jobs += [{"kind": "figure2", "setting": "paired", "method": "igfl-s", "seed": s, "num_nodes": args.silo_clients,
              "overrides": {**common, "method": "igfl-s", "igfl-attention": "self", "partition": "shards", "paired-clients": True,
                            "clients-per-round": args.silo_clients, "seed": s}}
             for s in range(args.figure2_seeds)]
    t0 = time.time()
    runs = run_jobs(jobs, args.workers, lambda r: f"{r['setting']:22s} {LABELS[r['method']]:8s} seed {r['seed']}")

    names = list(grid)
    table = "| Method | " + " | ".join(names) + " |\n|---|" + "---|" * len(names)
    rows = []
    for m in args.methods:
        cells = []
        for name in names:
            sel = [r["summary"][METRIC] for r in runs if r["kind"] == "table" and r["method"] == m and r["setting"] == name]
            cells.append(fmt(sel))
            rows.append({"method": m, "setting": name, METRIC: sel})
        table += f"\n| {LABELS[m]} | " + " | ".join(cells) + " |"
    paper = PAPER.get(args.dataset)
    if paper:
        cols = ["cross-silo"] + [f"cross-device ρ={r:g}" for r in RHOS]
        table += "\n\nThe paper's numbers (E = 1): " + "; ".join(
            f"{LABELS[m]} " + ", ".join(f"{c} {v:.2f}" for c, v in zip(cols, vals) if v is not None)
            for m, vals in paper.items())
    pairs = [r["summary"] for r in runs if r["kind"] == "figure2"]
    if pairs:
        hit = [s["attention_model_strongest_same_labels"] for s in pairs]
        chance = [s["attention_model_chance_same_labels"] for s in pairs]
        table += (f"\n\nFigure 2 check ({len(pairs)} paired populations of {args.silo_clients} clients, IGFL-S self attention, "
                  f"mean over {args.rounds} rounds): the strongest off-diagonal attention falls on a client with the same "
                  f"labels for {100 * np.mean(hit):.1f}% of clients (min {100 * np.min(hit):.0f}%; chance "
                  f"{100 * np.mean(chance):.1f}%; paper: up to 96%).")
    note = (f"\n\n{args.dataset}, {model.upper()}, T={args.rounds} rounds, {args.local_steps} local steps of batch "
            f"{args.batch_size}, η_l={args.lr} for every method, server learning rate 1 except FedAdam (η={args.fedadam_eta}, "
            f"τ={args.fedadam_tau}), FedAvgM β=0.9. Cross-silo: {args.silo_clients} clients, all train, 2 label shards each; "
            f"cross-device: {args.device_clients} clients, {args.device_clients // 10} per round, Dirichlet(ρ). "
            f"Test accuracy on all clients' test splits pooled (global methods: the global model; personalized ones: "
            f"each client's own model), averaged over the last 10% of rounds, "
            f"in %, mean ± std over seeds {args.seeds}. {machine(args.workers)}. Total {time.time() - t0:.0f} s.")
    print("\n" + table + note)
    save(out, table + note, {"settings": vars(args) | {"out": str(out), "model": model}, "rows": rows, "runs": runs})
    panels = {name: {LABELS[m]: [r for r in runs if r["kind"] == "table" and r["setting"] == name and r["method"] == m]
                     for m in args.methods} for name in (names[0], names[-1])}
    plot_curves(panels, out / "curves.png", "test accuracy, all clients pooled (%)", key="accuracy")
    if pairs:
        first = next(r for r in runs if r["kind"] == "figure2")
        (out / "figure2_attention.png").write_bytes((Path(first["results_dir"]) / "attention.png").read_bytes())


if __name__ == "__main__":
    main()
