"""How the clients' starting models decide FedMCSA's outcome on Synthetic (the Table 1 setting).

Runs FedMCSA (and optionally FedACS, FedAMP) with run config ``init`` = shared / zero /
independent and FedMCSA with ``init-scale`` multiples of the shared model, over seeds, one run at
a time (the real ServerApp/ClientApp code in-process). Per round it reads the attention matrices
the run saved (``attention_rounds.npz``): the mean self-attention (the diagonal) on the weight
matrix and, for FedMCSA, the mean cosine between the participants' weight matrices, recovered
exactly from eq. (7): ``psi_ij / psi_ii = exp(sigma (cos_ij - 1))``, so
``cos_ij = 1 + ln(psi_ij / psi_ii) / sigma`` (an all-zero model, a client's first round under
``init = zero``, has cosine 0 with every model). Results accumulate in ``results.json``: a
second call runs only what is missing, then rewrites ``table.md`` and ``attention.png``.

    python -m benchmarks.fedmcsa_init                                   # FedMCSA, 3 inits, 3 seeds, T=200
    python -m benchmarks.fedmcsa_init --inits shared --scales 0.5 0.7   # the init-scale switch
    python -m benchmarks.fedmcsa_init --methods fedacs fedamp --inits shared zero
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from benchmarks.common import fmt, machine, run_jobs
from benchmarks.fedmcsa_table1 import PAPER_SETTINGS

LABELS = {"fedmcsa": "FedMCSA", "fedacs": "FedACS", "fedamp": "FedAMP"}
INITS = ("shared", "zero", "independent")
#: the weight-matrix component of the MLR in each method's attention (FedMCSA: per tensor; the others: whole model)
COMPONENT = {"fedmcsa": "fc.weight", "fedacs": "model", "fedamp": "model"}


def round_statistics(ids: np.ndarray, counts: np.ndarray, weights: np.ndarray, sigma: float | None,
                     zero_first: bool) -> dict[str, list[float]]:
    """Per training round (as saved in ``attention_rounds.npz``: participants ``ids``, their number
    ``counts``, ``(R, m, m)`` ``weights`` of one component): the mean self-attention (diagonal), the
    same over the participants that took part in an earlier round (NaN if none) and, when ``sigma``
    is given (FedMCSA's softmax attention), the mean off-diagonal cosine behind it; with
    ``zero_first`` a client's first round counts as an all-zero model (``init = zero``)."""
    seen: set[str] = set()
    diagonal, returning, cosine = [], [], []
    for r, m in enumerate(counts):
        w = weights[r, :m, :m].astype(np.float64)
        diagonal.append(float(np.mean(np.diag(w))))
        back = np.array([cid in seen for cid in ids[r, :m]])
        returning.append(float(np.mean(np.diag(w)[back])) if back.any() else float("nan"))
        if sigma is None:
            seen.update(ids[r, :m])
            continue
        with np.errstate(divide="ignore"):
            cos = np.clip(1.0 + np.log(w / np.diag(w)[:, None]) / sigma, -1.0, 1.0)
        fresh = np.array([zero_first and cid not in seen for cid in ids[r, :m]])
        cos[fresh, :] = cos[:, fresh] = 0.0  # an all-zero model: cosine 0 with everything
        seen.update(ids[r, :m])
        cosine.append(float(cos[~np.eye(m, dtype=bool)].mean()))
    return {"self_attention": diagonal, "self_attention_returning": returning, "cosine": cosine}


def _key(job: dict) -> str:
    return f"{job['method']}/{job['init']}/x{job['scale']:g}/seed{job['seed']}"


def _label(run: dict) -> str:
    scale = f", ×{run['scale']:g}" if run["scale"] != 1 else ""
    return f"{LABELS[run['method']]}, init {run['init']}{scale}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", nargs="+", default=["fedmcsa"], choices=sorted(LABELS))
    ap.add_argument("--inits", nargs="+", default=list(INITS), choices=INITS)
    ap.add_argument("--scales", nargs="+", type=float, default=[1.0], help="init-scale values (shared, independent)")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--eval-every", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "fedmcsa_init")
    ap.add_argument("--report", action="store_true", help="only rewrite table.md and attention.png from results.json")
    args = ap.parse_args()
    store = args.out / "results.json"
    done = json.loads(store.read_text()) if store.exists() else {"runs": {}}
    if not args.report:
        jobs = [{"method": m, "init": i, "scale": 1.0 if i == "zero" else s, "seed": seed, "num_nodes": 100,
                 "overrides": {**PAPER_SETTINGS, "method": m, "init": i, "init-scale": 1.0 if i == "zero" else s,
                               "seed": seed, "num-rounds": args.rounds, "eval-every": args.eval_every,
                               "checkpoint-every": 0,
                               "max-update-ratio": 0.0, "output-dir": str(args.out / "runs")}}
                for m in args.methods for i in args.inits for s in args.scales for seed in args.seeds]
        jobs = list({_key(j): j for j in jobs if _key(j) not in done["runs"]}.values())
        for job in jobs:  # one at a time, saved as it ends
            t0 = time.time()
            run = run_jobs([job], 1, lambda r: f"{_label(r)}, seed {r['seed']}")[0]
            run["rounds"] = _statistics_of(run)
            run["wall_s"] = time.time() - t0
            run.pop("overrides")
            done["runs"][_key(job)] = run
            done["settings"] = {**PAPER_SETTINGS, "rounds": args.rounds, "eval_every": args.eval_every}
            args.out.mkdir(parents=True, exist_ok=True)
            store.write_text(json.dumps(done, indent=1, default=str))
    for run in done["runs"].values():  # runs recorded before a statistic was added get it from their folder
        if "self_attention_returning" not in run["rounds"] and (Path(run["results_dir"]) / "attention_rounds.npz").exists():
            run["rounds"] = _statistics_of(run)
    if done["runs"]:
        store.write_text(json.dumps(done, indent=1, default=str))
    report(list(done["runs"].values()), done.get("settings", {}), args.out)


def _statistics_of(run: dict) -> dict[str, list[float]]:
    """``round_statistics`` of a finished run, from the attention it saved."""
    saved = np.load(Path(run["results_dir"]) / "attention_rounds.npz")
    sigma = PAPER_SETTINGS["fedmcsa-sigma"] if run["method"] == "fedmcsa" else None
    return round_statistics(saved["ids"], saved["num_participants"], saved[COMPONENT[run["method"]]], sigma,
                            zero_first=run["init"] == "zero")


def _groups(runs: list[dict]) -> dict[tuple[str, str, float], list[dict]]:
    out: dict[tuple[str, str, float], list[dict]] = {}
    for r in sorted(runs, key=lambda r: (list(LABELS).index(r["method"]), INITS.index(r["init"]), r["scale"], r["seed"])):
        out.setdefault((r["method"], r["init"], r["scale"]), []).append(r)
    return out


def _at(values: list[float], rounds: int) -> float:
    """The mean of ``values`` over the last ``rounds`` rounds."""
    return float(np.mean(values[-rounds:]))


def report(runs: list[dict], settings: dict, out: Path) -> None:
    """``table.md`` (one row per method, init and scale) and ``attention.png``."""
    header = ("| Method | init | init-scale | seeds | BMTA % | sample-weighted BMTA % | best round | self-attention, round 10 | "
              "self-attention, last 10% | self-attention, returning clients | cosine, round 10 | cosine, last 10% |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for (method, init, scale), sel in _groups(runs).items():
        n = max(1, len(sel[0]["rounds"]["self_attention"]) // 10)
        early = [r["rounds"]["self_attention"][9] for r in sel]
        late = [_at(r["rounds"]["self_attention"], n) for r in sel]
        returning = [np.nanmean(r["rounds"].get("self_attention_returning", [np.nan])) for r in sel]
        cos_early = [r["rounds"]["cosine"][9] for r in sel] if method == "fedmcsa" else None
        cos_late = [_at(r["rounds"]["cosine"], n) for r in sel] if method == "fedmcsa" else None
        rows.append(
            f"| {LABELS[method]} | {init} | {'—' if init == 'zero' else f'{scale:g}'} | {len(sel)} | "
            f"{fmt([r['summary']['bmta'] for r in sel])} | {fmt([r['summary']['bmta_weighted'] for r in sel])} | "
            f"{np.mean([r['summary']['bmta_round'] for r in sel]):.0f} | {np.mean(early):.3f} | {np.mean(late):.3f} | "
            f"{np.mean(returning):.3f} | "
            f"{'—' if cos_early is None else f'{np.mean(cos_early):.3f}'} | {'—' if cos_late is None else f'{np.mean(cos_late):.3f}'} |")
    seconds = np.mean([r["summary"]["seconds_per_round"] for r in runs]) if runs else float("nan")
    note = (f"\n\nSynthetic({settings.get('synthetic-alpha')}, {settings.get('synthetic-beta')}), MLR, 100 clients, "
            f"S = {settings.get('clients-per-round')}, R = {settings.get('local-steps')}, |D| = {settings.get('batch-size')}, "
            f"η = {settings.get('lr')}, λ = {settings.get('fedmcsa-lambda', settings.get('lam'))}, σ = {settings.get('fedmcsa-sigma', settings.get('sigma'))}, T = {settings.get('rounds')}, "
            f"evaluated every {settings.get('eval_every')} rounds; FedACS and FedAMP at their defaults. BMTA and its round: "
            "mean ± std (round: mean) over seeds. Self-attention: the mean diagonal of the round's attention on the weight "
            "matrix (FedMCSA: `fc.weight`'s; FedACS, FedAMP: the whole model's), at round 10 and averaged over the last 10% "
            "of rounds, mean over seeds; returning clients: the diagonal over the participants that took part in an earlier "
            "round, mean over rounds (a client's first round under init zero is an all-zero model, attending uniformly). Cosine: the mean off-diagonal cosine between the participants' weight matrices "
            "(FedMCSA; recovered from its softmax attention). init-scale multiplies the shared model. "
            "max-update-ratio = 0 (off) in every run: near-zero starting models would otherwise have honest updates "
            "refused. "
            f"{machine(1)}, {seconds:.2f} s/round on average.")
    table = "\n".join([header, *rows]) + note
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(table + "\n")
    print(table)
    plot_attention(runs, out / "attention.png")


def plot_attention(runs: list[dict], path: Path) -> None:
    """Self-attention per round (mean over seeds; FedMCSA: on the weight matrix), one line per init
    and scale; one panel per method, two per row, and FedMCSA's cosine in a panel of its own."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    groups = _groups(runs)
    methods = list(dict.fromkeys(m for m, _, _ in groups))
    panels = [(m, "self_attention") for m in methods] + ([("fedmcsa", "cosine")] if "fedmcsa" in methods else [])
    cols = min(2, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 4.2 * rows), dpi=120, squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, (method, key) in zip(axes.flat, panels):
        for (m, _init, _scale), sel in groups.items():
            if m != method:
                continue
            curve = np.mean([r["rounds"][key] for r in sel], axis=0)
            ax.plot(np.arange(1, len(curve) + 1), curve, label=_label(sel[0]).split(", ", 1)[1] + f" ({len(sel)} seeds)")
        part = "the weight matrix" if method == "fedmcsa" else "the whole model"
        what = f"self-attention on {part}" if key == "self_attention" else "mean cosine between weight matrices"
        ax.set(title=f"{LABELS[method]}: {what}", xlabel="round", ylabel=what)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


if __name__ == "__main__":
    main()
