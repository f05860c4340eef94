"""Compare finished runs: one table and one learning-curve overlay from results folders.

    python -m flower_pfl compare results/fedmcsa-* results/ditto-* --out results/compare
    python -m flower_pfl compare results/sweeps/alpha --out /tmp/c --by method,dirichlet-alpha

Each path (or glob) is a results folder (``summary.json``), a sweep folder (``sweep.json``), a
benchmark folder (``results.json`` of the scripts in ``benchmarks/``), or any folder holding
these further down. Runs whose summary is not ``completed`` are left out.

Runs are grouped into rows by method and setting; seeds are pooled. The method is the run's
label (``fedavg``, ``fedavg+mcsa``), or its name in the sweep that made it. The setting is, with
``--by``, the values of the keys listed there; otherwise the sweep's setting name where every run
has one, else the run-config keys whose values differ between the runs (a method
hyperparameter counts only where it varies within one method's runs, since it otherwise only
tells the methods apart; ``seed``, ``output-dir`` and other bookkeeping keys never count).

Outputs in ``--out``: ``table.md`` and ``table.csv`` (per method × setting: BMTA, sample-weighted
BMTA, last-10% mean, its sample-weighted twin and final accuracy, each mean ± std over seeds in
%, population std as ``numpy.std``; and the number of seeds) and ``curves.png`` (``accuracy-mean``
per evaluated round, mean over seeds with the min..max band, one panel per setting). The sweep
(``flower_pfl.tools.sweep``) writes its report with this module.
"""

from __future__ import annotations

import argparse
import csv
import glob
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from flower_pfl.engine.extras import require
from flower_pfl.experiment.config import ExperimentConfig
from flower_pfl.methods import registry
from flower_pfl.run.results import CONFIG, MEAN, METRICS, SUMMARY, figures_stand

#: where the sweep notes, beside a cell's results folder, what the cell was
CELL = "cell.json"
#: a sweep's record of every cell (``flower_pfl.tools.sweep``)
SWEEP = "sweep.json"
#: a benchmark script's record of its runs (``benchmarks/common.save``)
BENCHMARK = "results.json"
#: keys that never tell settings apart (bookkeeping, paths, where the run ran)
IGNORED = frozenset({"seed", "output-dir", "resume-from", "data-dir", "device", "download", "checkpoint-every",
                     "node-wait-timeout", "store", "method", "aggregation", "client-state-dir", "allow-empty-client-state",
                     "target-accuracy"})
#: the table's figures: (summary key, column title)
COLUMNS: tuple[tuple[str, str], ...] = (
    ("bmta", "BMTA %"),
    ("bmta_weighted", "sample-weighted BMTA %"),
    ("last10_mean_accuracy", "last-10% mean %"),
    ("last10_mean_accuracy_weighted", "last-10% sample-weighted %"),
    ("final_accuracy", "final %"),
)
#: figures a table shows where some of its runs have them (docs/evaluation.md): (summary key, column title)
EVALUATION_COLUMNS: tuple[tuple[str, str], ...] = (
    ("val_selected_accuracy", "chosen on validation %"),
    ("bottom10_accuracy", "bottom decile %"),
    ("unseen_accuracy", "new clients %"),
    ("participation_gap", "participation gap %"),
    ("bytes_total", "MB sent"),
    ("train_time_per_client_round_s", "s of training per client-round"),
    ("peak_memory_node_mib", "node peak MiB"),
)
#: the figures shown in their own unit, not in % (the factor from the summary's value to the column's)
UNITS: dict[str, float] = {"bytes_total": 1e-6, "train_time_per_client_round_s": 1.0, "peak_memory_node_mib": 1.0}
#: the figures a table can lead with (``--figure``): BMTA is chosen on the test data, the other on validation
FIGURES = ("bmta", "val_selected_accuracy")


def columns(rows: Sequence[Row], figure: str = "bmta") -> list[tuple[str, str]]:
    """The table's columns: ``figure``'s first, then the others of ``COLUMNS``, then each of ``EVALUATION_COLUMNS``
    that some run of ``rows`` has."""
    have = {k for row in rows for r in row.runs for k in r.summary}
    out = [*COLUMNS, *((key, title) for key, title in EVALUATION_COLUMNS if key in have)]
    lead = [c for c in out if c[0] == figure] or [c for c in EVALUATION_COLUMNS if c[0] == figure]
    return lead + [c for c in out if c[0] != figure]


@dataclass
class Run:
    """One finished run: its row name, its sweep setting (if any), run config, summary, folder."""

    method: str
    config: dict[str, Any]
    summary: dict[str, Any]
    folder: Path | None = None
    setting: str | None = None


@dataclass
class Row:
    """The runs of one method in one setting (one per seed)."""

    setting: str
    method: str
    runs: list[Run] = field(default_factory=list)

    def values(self, key: str) -> list[float]:
        return [float(r.summary[key]) for r in self.runs if isinstance(r.summary.get(key), (int, float))]


def fmt(values: Iterable[float], scale: float = 100.0) -> str:
    """``mean ± std`` of the values times ``scale`` (default: in percent; population std), ``—`` for no value."""
    v = [x for x in values if not math.isnan(x)]
    return f"{scale * np.mean(v):.2f} ± {scale * np.std(v):.2f}" if v else "—"


def completed(summary: Mapping[str, Any]) -> bool:
    """A summary with figures from rounds that reached enough clients: runs ``degraded`` by short
    rounds are left out (``flower_pfl.run.results.Coverage``), those with idle rounds alone kept
    (``flower_pfl.run.results.figures_stand``)."""
    return figures_stand(summary)


def load_folder(folder: Path) -> Run | None:
    """A results folder's run, or None if it did not complete."""
    summary = json.loads((folder / SUMMARY).read_text())
    if not completed(summary):
        return None
    config = json.loads((folder / CONFIG).read_text()) if (folder / CONFIG).exists() else {}
    cell = json.loads((folder.parent / CELL).read_text()) if (folder.parent / CELL).exists() else {}
    if "num-nodes" in cell:
        config["num-nodes"] = cell["num-nodes"]
    method = cell.get("method") or _label(config)
    return Run(method, config, summary, folder, cell.get("setting"))


def load_benchmark(path: Path) -> list[Run]:
    """The runs a benchmark script recorded in its ``results.json`` (run config = today's defaults
    + the run's overrides; the run folders themselves need not exist)."""
    defaults = ExperimentConfig().to_run_config()
    runs = []
    for job in json.loads(path.read_text())["runs"]:
        if not completed(job["summary"]):
            continue
        config = {**defaults, **job["overrides"], "num-nodes": job.get("num_nodes")}
        folder = Path(job["results_dir"]) if job.get("results_dir") else None
        runs.append(Run(job.get("variant") or _label(config), config, job["summary"],
                        folder if folder is not None and folder.is_dir() else None, job.get("setting")))
    return runs


def load_sweep(folder: Path) -> list[Run]:
    """A sweep's completed cells, in the sweep's order (their folders relative to the sweep's)."""
    runs = []
    for cell in json.loads((folder / SWEEP).read_text())["cells"]:
        if cell.get("results_dir") and (run := load_folder(folder / cell["results_dir"])) is not None:
            runs.append(run)
    return runs


def load(paths: Iterable[str | Path]) -> list[Run]:
    """Every completed run under ``paths`` (folders or globs), each once, in the order found."""
    runs: list[Run] = []
    seen: set[Path] = set()
    for pattern in paths:
        matches = sorted(glob.glob(str(pattern))) or [str(pattern)]
        for match in map(Path, matches):
            if not match.exists():
                raise FileNotFoundError(f"no results folder matches {str(pattern)!r}")
            for run in _load_any(match):
                key = (run.folder or Path(f"<{id(run)}>")).resolve()
                if key not in seen:
                    seen.add(key)
                    runs.append(run)
    return runs


def _load_any(path: Path) -> list[Run]:
    if path.is_file():
        path = path.parent
    if (path / SWEEP).exists():
        return load_sweep(path)
    if (path / SUMMARY).exists():
        return [r for r in [load_folder(path)] if r is not None]
    if (path / BENCHMARK).exists():
        return load_benchmark(path / BENCHMARK)
    return [r for s in sorted(path.rglob(SUMMARY)) if (r := load_folder(s.parent)) is not None]


def _label(config: Mapping[str, Any]) -> str:
    aggregation = config.get("aggregation", "default")
    return config.get("method", "?") + ("" if aggregation == "default" else f"+{aggregation}")


def setting_keys(runs: Sequence[Run]) -> list[str]:
    """The run-config keys whose values tell settings apart (see the module docstring)."""
    keys = sorted({k for r in runs for k in r.config} - IGNORED)
    options = registry.option_specs()
    out = []
    for key in keys:
        if len({_hashable(r.config.get(key)) for r in runs}) < 2:
            continue
        per_method: dict[str, set] = {}
        for r in runs:
            per_method.setdefault(r.method, set()).add(_hashable(r.config.get(key)))
        if key in options and all(len(v) == 1 for v in per_method.values()):
            continue  # a hyperparameter that only tells the methods apart
        out.append(key)
    return out


def group(runs: Sequence[Run], by: Sequence[str] | None = None) -> list[Row]:
    """Rows of (setting, method) in the order the runs first show them, settings first."""
    keys = [k for k in by if k != "method"] if by else None
    if keys is None and not all(r.setting is not None for r in runs):
        keys = setting_keys(runs)
    rows: dict[tuple[str, str], Row] = {}
    for run in runs:
        setting = run.setting if keys is None else (
            ", ".join(f"{k}={_show(run.config.get(k))}" for k in keys) or "all runs")
        rows.setdefault((setting, run.method), Row(setting, run.method)).runs.append(run)  # type: ignore[arg-type]  # a sweep's runs carry their setting
    order = list(dict.fromkeys(s for s, _ in rows))
    return sorted(rows.values(), key=lambda row: order.index(row.setting))


def _hashable(value: Any) -> Any:
    return json.dumps(value, sort_keys=True)


def _show(value: Any) -> str:
    return "—" if value is None else str(value)


def table_md(rows: Sequence[Row], figure: str = "bmta") -> str:
    shown = columns(rows, figure)
    header = "| Setting | Method | " + " | ".join(title for _, title in shown) + " | seeds |"
    lines = [header, "|---|---|" + "---|" * len(shown) + "---|"]
    for row in rows:
        cells = [fmt(row.values(key), UNITS.get(key, 100.0)) for key, _ in shown]
        lines.append(f"| {row.setting} | {row.method} | " + " | ".join(cells) + f" | {len(row.runs)} |")
    return "\n".join(lines)


def write_csv(rows: Sequence[Row], path: Path, figure: str = "bmta") -> None:
    """One line per row: each figure's mean and std over seeds (in %, or in its own unit: ``UNITS``), and the
    number of seeds."""
    shown = columns(rows, figure)
    with path.open("w", newline="") as fh:
        out = csv.writer(fh)
        unit = lambda key: "pct" if key not in UNITS else "mb" if key == "bytes_total" else "value"
        out.writerow(["setting", "method", *(f"{key}_{s}_{unit(key)}" for key, _ in shown for s in ("mean", "std")), "seeds"])
        for row in rows:
            figures: list[float | str] = []
            for key, _ in shown:
                v, scale = row.values(key), UNITS.get(key, 100.0)
                figures += [scale * float(np.mean(v)), scale * float(np.std(v))] if v else ["", ""]
            out.writerow([row.setting, row.method, *figures, len(row.runs)])


def curve(folder: Path) -> tuple[list[int], list[float]]:
    """``accuracy-mean`` per evaluated round of a results folder."""
    rows = [json.loads(line) for line in (folder / METRICS).read_text().splitlines() if line.strip()]
    evaluated = [(int(r["round"]), float(r[MEAN])) for r in rows if r.get("phase") == "evaluate" and MEAN in r]
    return [r for r, _ in evaluated], [a for _, a in evaluated]


def seed_band(runs: Sequence[Run]) -> tuple[list[int], np.ndarray, np.ndarray, np.ndarray] | None:
    """Rounds evaluated in every run with a folder, and the mean, min and max over runs there."""
    curves = [dict(zip(*curve(r.folder))) for r in runs if r.folder is not None and (r.folder / METRICS).exists()]
    curves = [c for c in curves if c]
    if not curves:
        return None
    rounds = sorted(set.intersection(*(set(c) for c in curves)))
    values = np.array([[c[rnd] for rnd in rounds] for c in curves])
    return rounds, values.mean(axis=0), values.min(axis=0), values.max(axis=0)


LINE_STYLES = ("-", "--", "-.", ":")


def line_style(index: int) -> dict[str, object]:
    """The ``index``-th method's colour and dash: ten colours, then the same ten dashed (40 distinct)."""
    import matplotlib.pyplot as plt

    return {"color": plt.get_cmap("tab10")(index % 10), "linestyle": LINE_STYLES[(index // 10) % len(LINE_STYLES)]}


def draw_setting(ax: Any, bands: dict[str, tuple], seeds: dict[str, int]) -> None:
    """One panel: each method's mean curve, its seed band, a legend ordered by final accuracy."""
    from matplotlib.ticker import MaxNLocator

    for i, (method, (rounds, mean, low, high)) in enumerate(bands.items()):
        n = seeds[method]
        label = f"{method} ({n} seed{'s' * (n != 1)})"
        ax.plot(rounds, mean, marker="o", markersize=2.5, linewidth=1.2, label=label, **line_style(i))
        if n > 1:
            ax.fill_between(rounds, np.clip(low, 0, 1), np.clip(high, 0, 1), alpha=0.12, linewidth=0,
                            color=line_style(i)["color"])
    ax.set(xlabel="round", ylabel="mean test accuracy over clients", ylim=(0, 1))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    order = sorted(range(len(labels)), key=lambda k: -list(bands.values())[k][1][-1])
    handles, labels = [handles[k] for k in order], [labels[k] for k in order]
    if len(bands) <= 8:
        ax.legend(handles, labels, loc="lower right", fontsize=8)
    else:   # many methods: beside the panel, best final accuracy first
        ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7,
                  ncol=math.ceil(len(bands) / 24), title="final accuracy, best first", title_fontsize=7)


def plot(rows: Sequence[Row], path: Path) -> bool:
    """Overlaid learning curves, one panel per setting; False (nothing written) without any curve."""
    require("matplotlib", why="the comparison's curves")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bands = {(row.setting, row.method): band for row in rows if (band := seed_band(row.runs)) is not None}
    seeds = {(row.setting, row.method): len(row.runs) for row in rows}
    settings = list(dict.fromkeys(s for s, _ in bands))
    if not settings:
        return False
    most = max(sum(s == setting for s, _ in bands) for setting in settings)
    cols = min(len(settings), 3 if most <= 8 else 2)
    nrows = math.ceil(len(settings) / cols)
    width, height = (5.5, 4.0) if most <= 8 else (9.0, max(4.0, 0.16 * min(most, 24) + 1))
    fig, axes = plt.subplots(nrows, cols, figsize=(width * cols, height * nrows), dpi=120, squeeze=False)
    for ax, setting in zip(axes.flat, settings):
        draw_setting(ax, {m: b for (s, m), b in bands.items() if s == setting},
                     {m: n for (s, m), n in seeds.items() if s == setting})
        ax.set_title(setting)
    for ax in list(axes.flat)[len(settings):]:
        ax.set_visible(False)
    fig.suptitle("mean over seeds; band: min..max over seeds; markers: evaluated rounds", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return True


def report(runs: Sequence[Run], out: str | Path, by: Sequence[str] | None = None, figure: str = "bmta") -> list[Row]:
    """Write ``table.md``, ``table.csv`` and ``curves.png`` for ``runs`` into ``out``, ``figure``'s column first;
    returns the rows."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = group(runs, by)
    (out / "table.md").write_text(table_md(rows, figure) + "\n")
    write_csv(rows, out / "table.csv", figure)
    plot(rows, out / "curves.png")
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m flower_pfl compare", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+", help="results folders, sweep or benchmark folders, or globs")
    ap.add_argument("--out", type=Path, required=True, help="folder for table.md, table.csv, curves.png")
    ap.add_argument("--by", default=None, help="comma-separated keys that make a setting (default: those that differ)")
    ap.add_argument("--figure", choices=FIGURES, default="bmta",
                    help="the table's first column: bmta (the best round on the test data, the papers' figure) or "
                         "val_selected_accuracy (the test figure of the round chosen on validation; runs with val-fraction)")
    args = ap.parse_args(argv)
    runs = load(args.paths)
    if not runs:
        raise SystemExit(f"no completed run under {' '.join(args.paths)}")
    rows = report(runs, args.out, args.by.split(",") if args.by else None, args.figure)
    print(table_md(rows, args.figure))
    print(f"\n{len(runs)} runs; written to {args.out}")


if __name__ == "__main__":
    main()
