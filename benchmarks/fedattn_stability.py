"""FedAttn (Luo, Panchal, Guan) as written and with the stabilisers its authors propose, against FedAvg,
FedMCSA and Local.

Every client evaluates its personalized model (FedAttn: the global model with the biases the
attention gives it; FedAvg: the global model) on its own test split. The paper reports sudden
collapses, so the script counts them: an evaluated round whose mean accuracy is more than
``--drop`` points under the best so far. Per-seed curves are plotted, since averaging seeds
would hide a collapse.

    python -m benchmarks.fedattn_stability                                    # Synthetic, ~10 min on 2 cores
    python -m benchmarks.fedattn_stability --dataset femnist --hub-dataset DIR  # FEMNIST by writer, when there
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from benchmarks.common import caption, finish_plot, fmt, machine, run_jobs, save
from flower_pfl.reports.figures import format_value

#: name -> (method, extra run config)
VARIANTS = {
    "FedAttn": ("fedattn", {}),
    "FedAttn + bias reg.": ("fedattn", {"fedattn-bias-reg": "BIAS_REG"}),
    "FedAttn + warm-up": ("fedattn", {"fedattn-warmup": "WARMUP"}),
    "FedAttn + both": ("fedattn", {"fedattn-bias-reg": "BIAS_REG", "fedattn-warmup": "WARMUP"}),
    "FedAttn + fixed W_V": ("fedattn", {"fedattn-learn-values": False}),
    "FedAttn + all three": ("fedattn", {"fedattn-bias-reg": "BIAS_REG", "fedattn-warmup": "WARMUP", "fedattn-learn-values": False}),
    "FedAvg": ("fedavg", {}),
    "FedMCSA": ("fedmcsa", {}),
    "Local": ("local", {}),
}
DEFAULT_MODEL = {"synthetic": "dnn", "femnist": "cnn"}


def curve(run: dict) -> tuple[list[int], list[float]]:
    rows = [json.loads(x) for x in (Path(run["results_dir"]) / "metrics.jsonl").read_text().splitlines()]
    ev = [(r["round"], r["accuracy-mean"]) for r in rows if r["phase"] == "evaluate" and "accuracy-mean" in r]
    return [r for r, _ in ev], [a for _, a in ev]


def collapses(acc: list[float], drop: float) -> int:
    """Evaluated rounds more than ``drop`` (fraction) under the best accuracy so far."""
    best, count = -1.0, 0
    for a in acc:
        best = max(best, a)
        count += a < best - drop
    return count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="synthetic", choices=sorted(DEFAULT_MODEL))
    ap.add_argument("--hub-dataset", default="", help="femnist: hub id or local folder (default: the usual hub id)")
    ap.add_argument("--model", default=None)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--clients-per-round", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--local-steps", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=20)
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--attention-lr", type=float, default=0.01)
    ap.add_argument("--bias-reg", type=float, default=1.0)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--drop", type=float, default=10.0, help="a collapse: this many points under the best so far")
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/fedattn_<dataset>")
    args = ap.parse_args()
    model = args.model or DEFAULT_MODEL[args.dataset]
    out = args.out or Path(__file__).parent / "results" / f"fedattn_{args.dataset}"
    source = {"data-source": "huggingface", "hub-dataset": args.hub_dataset} if args.dataset == "femnist" else {}
    common = {"dataset": args.dataset, **source, "partition": "natural", "model": model, "num-rounds": args.rounds,
              "clients-per-round": args.clients_per_round, "local-steps": args.local_steps, "batch-size": args.batch_size,
              "lr": args.lr, "fedattn-k": args.k, "fedattn-lr": args.attention_lr, "eval-every": args.eval_every,
              "device": "cpu", "output-dir": str(out / "runs")}
    values = {"BIAS_REG": args.bias_reg, "WARMUP": args.warmup}
    jobs = []
    for name in args.variants:
        method, extra = VARIANTS[name]
        for seed in args.seeds:
            jobs.append({"variant": name, "seed": seed, "num_nodes": args.clients,
                         "overrides": {**common, "method": method, "seed": seed, **{k: values.get(v, v) for k, v in extra.items()}}})
    t0 = time.time()
    runs = run_jobs(jobs, args.workers, lambda r: f"{r['variant']:20s} seed {r['seed']}")

    table = "| Method | BMTA | last 10% | final | best − final | collapses (runs with one) |\n|---|---|---|---|---|---|"
    rows = []
    for name in args.variants:
        sel = [r for r in runs if r["variant"] == name]
        falls = [collapses(curve(r)[1], args.drop / 100) for r in sel]
        rows.append({"variant": name, "bmta": [r["summary"]["bmta"] for r in sel], "collapses": falls,
                     "last10": [r["summary"]["last10_mean_accuracy"] for r in sel]})
        table += (f"\n| {name} | {fmt(r['summary']['bmta'] for r in sel)} | {fmt(r['summary']['last10_mean_accuracy'] for r in sel)} "
                  f"| {fmt(r['summary']['final_accuracy'] for r in sel)} "
                  f"| {fmt(r['summary']['bmta'] - r['summary']['final_accuracy'] for r in sel)} "
                  f"| {sum(falls)} ({sum(f > 0 for f in falls)}/{len(sel)}) |")
    note = (f"\n\n{args.dataset} (natural clients), {model.upper()}, {args.clients} clients, {args.clients_per_round} per round, "
            f"T={args.rounds}, {args.local_steps} local steps of batch {args.batch_size}, η={args.lr}; FedAttn K={args.k}, "
            f"attention SGD step {args.attention_lr}, stabilisers: bias regularization {args.bias_reg}, warm-up {args.warmup} rounds. "
            f"Mean personalized test accuracy over clients in %, mean ± std over seeds {args.seeds}, evaluated every "
            f"{args.eval_every} rounds; a collapse is an evaluated round more than {args.drop:g} points under the run's best so far. "
            f"{machine(args.workers)}. Total {time.time() - t0:.0f} s.")
    print("\n" + table + note)
    save(out, table + note, {"settings": vars(args) | {"out": str(out), "model": model}, "rows": rows, "runs": runs})
    plot(runs, args.variants, out / "curves.png", args.dataset)


def plot(runs: list[dict], variants: list[str], path: Path, dataset: str) -> None:
    """One line per run (seed), one colour per method, a marker per evaluated round; the caption
    gives the settings all runs share, the stabilisers' values are in the run configs of their lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(9, 5.6), dpi=120)
    for colour, name in zip(plt.rcParams["axes.prop_cycle"].by_key()["color"], variants):
        for i, r in enumerate(r for r in runs if r["variant"] == name):
            rounds, acc = curve(r)
            ax.plot(rounds, 100 * np.asarray(acc), "-o", ms=2, color=colour, lw=1, alpha=0.8,
                    label=f"{name} ({_own_settings(r)})" if i == 0 and _own_settings(r) else name if i == 0 else None)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(title=f"{dataset}: per-seed mean personalized accuracy over clients", xlabel="round", ylabel="accuracy (%)")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    finish_plot(fig, path, caption(runs, per_seed=True))


def _own_settings(run: dict) -> str:
    """The stabilisers a variant sets (``fedattn-bias-reg=1``), for its legend entry."""
    method, extra = VARIANTS[run["variant"]]
    return ", ".join(f"{k}={format_value(run['overrides'][k])}" for k in extra)


if __name__ == "__main__":
    main()
