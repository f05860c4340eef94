"""What the benchmark scripts share: a pool of in-process runs, formatting, machine description."""

from __future__ import annotations

import json
import logging
import os
import platform
import shutil
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from flower_pfl.reports.figures import format_value
from flower_pfl.tools.compare import fmt  # noqa: F401 - the scripts' ``mean ± std`` in percent, as the sweep's tables


def _run(job: dict) -> dict:
    """One experiment in a worker process (the real ServerApp/ClientApp code, in-process grid)."""
    import torch

    from server_apps.inprocess import run_in_process

    torch.set_num_threads(1)
    logging.getLogger("flwr").setLevel(logging.WARNING)  # after Flower's logger is set up by the import

    out = run_in_process(job["overrides"], num_clients=job["num_nodes"])
    summary = json.loads((out / "summary.json").read_text())
    return {**job, "summary": summary, "results_dir": str(out)}


def run_jobs(jobs: list[dict], workers: int, describe: Callable[[dict], str]) -> list[dict]:
    """Run every job (each a dict with ``overrides`` and ``num_nodes``) in a process pool, printing progress."""
    t0 = time.time()
    runs = []
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for r in pool.map(_run, jobs):
            runs.append(r)
            s = r["summary"]
            print(f"[{time.time() - t0:6.0f}s] {describe(r)}: BMTA {100 * s['bmta']:.2f} "
                  f"(weighted {100 * s['bmta_weighted']:.2f}), {s['seconds_per_round']:.3f} s/round", flush=True)
    return runs


def machine(workers: int) -> str:
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch CPU, {workers} runs in parallel"


def mean_curve(runs: list[dict], key: str = "accuracy-mean") -> tuple[list[int], np.ndarray]:
    """Rounds and the mean (over runs) of evaluation metric ``key`` in each evaluated round."""
    curves = []
    for r in runs:
        rows = [json.loads(x) for x in (Path(r["results_dir"]) / "metrics.jsonl").read_text().splitlines()]
        curves.append([(x["round"], x[key]) for x in rows if x["phase"] == "evaluate"])
    n = min(len(c) for c in curves)
    return [rnd for rnd, _ in curves[0][:n]], np.mean([[a for _, a in c[:n]] for c in curves], axis=0)


def save(out: Path, table: str, payload: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(table + "\n")
    (out / "results.json").write_text(json.dumps(payload, indent=2, default=str))


def publish(table: str, payload: dict, out: Path | None, work: Path, keep: bool, kept: str) -> None:
    """Print ``table``, ``save`` it with ``payload`` in ``out`` (where given), and keep the runs' folder
    ``work`` (printed as ``kept``) or remove it."""
    print("\n" + table)
    if out:
        save(out, table, payload)
    if keep:
        print(f"\n{kept}: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)


#: run-config keys that say where a run ran, not what it did (left out of figure captions)
_PLACE = ("output-dir", "device", "data-dir", "hub-dataset", "download", "data-source", "seed")


def caption(runs: list[dict], per_seed: bool = False) -> str:
    """A figure's caption: the run-config values every run shares and the seeds (each line the mean
    over them, or with ``per_seed`` one line per seed)."""
    configs = [r["overrides"] for r in runs]
    missing = object()
    shared = {k: v for k, v in configs[0].items() if k not in _PLACE and all(c.get(k, missing) == v for c in configs[1:])}
    seeds = ", ".join(map(str, sorted({c["seed"] for c in configs if "seed" in c})))
    how = f"one line per seed ({seeds})" if per_seed else f"each line the mean over seeds {seeds}"
    return ", ".join(f"{k}={format_value(v)}" for k, v in shared.items()) + f"; {how}; markers: evaluated rounds"


def plot_curves(panels: Mapping[str, Mapping[str, list[dict]]], path: Path, ylabel: str, key: str = "accuracy-mean") -> None:
    """One panel per title; in each, one line per label: metric ``key`` per evaluated round (marked),
    mean over its runs; the caption (``caption``) gives the shared settings and the seeds."""
    from matplotlib.ticker import MaxNLocator

    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.6), dpi=120, squeeze=False)
    for ax, (title, lines) in zip(axes[0], panels.items()):
        for label, runs in lines.items():
            if runs:
                rounds, values = mean_curve(runs, key)
                ax.plot(rounds, 100 * values, "-o", ms=2.5, label=label)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set(title=title, xlabel="round", ylabel=ylabel)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    every = [r for lines in panels.values() for runs in lines.values() for r in runs]
    finish_plot(fig, path, caption(every) if every else "")


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def finish_plot(fig: Any, path: Path, text: str) -> None:
    """``text`` (wrapped to the figure's width) under the axes; saved and closed."""
    import textwrap

    lines = textwrap.wrap(text, int(fig.get_figwidth() * 15), break_on_hyphens=False)
    fig.text(0.01, 0.01, "\n".join(lines), fontsize=7.5, va="bottom", ha="left")
    fig.tight_layout(rect=(0, (0.15 + 0.14 * len(lines)) / fig.get_figheight(), 1, 1))
    fig.savefig(path)
    _pyplot().close(fig)
