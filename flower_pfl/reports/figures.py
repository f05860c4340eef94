"""The figures of a results folder (learning curve, client-by-client heatmaps) and the pure
helpers that decide what they show: the spread band, the client grouping, the run's title."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Hashable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from flower_pfl.engine.client_metrics import NEW_CLIENT_ROW
from flower_pfl.engine.extras import require
from flower_pfl.engine.wording import counted

if TYPE_CHECKING:
    from flower_pfl.experiment.config import ExperimentConfig

#: the spread band of the learning curve: these percentiles of the clients' accuracies
BAND_PERCENTILES = (10, 90)
#: the diagonal of a client-by-client matrix (a client with itself), drawn outside the colour scale
DIAGONAL_COLOUR = "0.55"
#: cells of pairs that have no value (clients that never met in a round), hatched
MISSING_HATCH = "////"
SEPARATOR: dict[str, Any] = {"color": "black", "lw": 0.9}
#: not selected / selected in a binary selection mask
MASK_COLOURS = ("#efefef", "#d95f02")
#: the partition schemes' own settings (shown in a figure's title)
_PARTITION_KEYS = {"dirichlet": ("dirichlet-alpha",), "pathological": ("classes-per-client",),
                   "shards": ("shards-per-client",)}


# --- what a figure says about its run -------------------------------------------------------------

def method_settings(cfg: ExperimentConfig) -> dict[str, Any]:
    """The run's method hyperparameters by run-config key (those its strategy reads), then what its
    registry entry fixes (by argument name)."""
    entry, options = cfg.entry, cfg.to_run_config()
    return {key: options[key] for key in entry.run_config_keys()} | dict(entry.fixed)


def format_value(v: Any) -> str:
    """A run-config value as a figure writes it (``true``, ``0.01``, ``tensor``)."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def run_title(cfg: ExperimentConfig, num_nodes: int | None = None) -> str:
    """Two lines (figures wrap them to their width): the method with its own settings, then the
    data, the model, the training settings, the seed and the Flower API."""
    settings = ", ".join(f"{k}={format_value(v)}" for k, v in method_settings(cfg).items())
    head = f"{cfg.label} ({settings})" if settings else cfg.label
    data = data_title(cfg)
    clients = (f"{cfg.clients_per_round} of {counted(num_nodes, 'client')} per round" if num_nodes
               else f"{counted(cfg.clients_per_round, 'client')} per round")
    seed = f"seed {cfg.seed}" + (f" (data {cfg.data_seed})" if cfg.data_seed >= 0 else "")
    tail = (f"{data} · {cfg.model} · {clients} · {counted(cfg.num_rounds, 'round')} · lr={format_value(cfg.lr)}, "
            f"{counted(cfg.local_steps, 'local step')} of batch {cfg.batch_size} · {seed} · {cfg.api} API")
    return f"{head}\n{tail}"


def data_title(cfg: ExperimentConfig) -> str:
    """The data set and its partition with the scheme's settings: ``cifar10, dirichlet partition (dirichlet-alpha=0.1)``."""
    extra = [f"{k}={format_value(cfg.to_run_config()[k])}" for k in _PARTITION_KEYS.get(cfg.partition, ())]
    extra += ["paired-clients"] if cfg.paired_clients else []
    return f"{cfg.dataset}, {cfg.partition} partition" + (f" ({', '.join(extra)})" if extra else "")


# --- the learning curve's spread band -------------------------------------------------------------

def client_accuracies(rows: Iterable[Mapping[str, Any]], key: str = "accuracy") -> dict[int, list[float]]:
    """``clients.jsonl`` rows as ``round -> every participating client's finite accuracy`` of that round (a client
    that never trains, ``new-client``, is not one: its figures are apart)."""
    out: dict[int, list[float]] = {}
    for row in rows:
        value = None if row.get(NEW_CLIENT_ROW) else row.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value):
            out.setdefault(int(row["round"]), []).append(float(value))
    return out


def spread_band(evaluations: Sequence[Mapping[str, float]], per_client: Mapping[int, Sequence[float]] | None = None,
                percentiles: tuple[float, float] = BAND_PERCENTILES) -> tuple[np.ndarray, np.ndarray, str]:
    """Lower and upper edge of the learning curve's band at each evaluated round, and its legend text.

    With every evaluated round's client accuracies (``per_client``): those percentiles over clients,
    the actual spread, which stays in [0, 1] by construction. Otherwise mean ± 1 std over clients,
    clipped to [0, 1] (an accuracy cannot leave it; the legend says so).
    """
    rounds = [int(e["round"]) for e in evaluations]
    if per_client and all(per_client.get(r) for r in rounds):
        lo, hi = (np.array([np.percentile(per_client[r], q) for r in rounds]) for q in percentiles)
        return lo, hi, f"{percentiles[0]:g}th–{percentiles[1]:g}th percentile over clients"
    mean = np.array([e["accuracy-mean"] for e in evaluations], dtype=float)
    std = np.array([e.get("accuracy-std", math.nan) for e in evaluations], dtype=float)
    return np.clip(mean - std, 0, 1), np.clip(mean + std, 0, 1), "±1 std over clients (clipped to [0, 1])"


def plot_learning_curve(evaluations: Sequence[Mapping[str, Any]], path: Path, title: str = "",
                        per_client: Mapping[int, Sequence[float]] | None = None) -> None:
    """Mean accuracy over clients with the spread band (``spread_band``) and the sample-weighted
    accuracy, one marker per evaluated round."""
    plt, MaxNLocator = _pyplot()
    rounds = [e["round"] for e in evaluations]
    lo, hi, band = spread_band(evaluations, per_client)
    fig, ax = plt.subplots(figsize=(7, 4.6), dpi=120)
    ax.fill_between(rounds, lo, hi, alpha=0.2, color="C0", lw=0, label=band)
    ax.plot(rounds, [e["accuracy-mean"] for e in evaluations], "-o", ms=4, color="C0", clip_on=False,
            label="mean over clients")
    ax.plot(rounds, [e.get("accuracy", math.nan) for e in evaluations], "--s", ms=3, color="C1", clip_on=False,
            label="sample-weighted mean")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel="round (markers: evaluated rounds)", ylabel="test accuracy of each client's own model", ylim=(0, 1))
    ax.set_title(_rewrap(title, 88), fontsize=8.5, loc="left")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    _save(fig, path)


# --- the partition -------------------------------------------------------------------------------

#: the partition figure stacks each client's label counts in a bar up to this many clients and classes, and
#: draws a heatmap (clients x labels) beyond
BAR_CLIENTS, BAR_LABELS = 40, 20
#: the partition figure shows at most this many clients (the first, by partition id)
MAX_PARTITION_CLIENTS = 1000


def label_counts(info: Mapping[int, Mapping[str, Any]]) -> np.ndarray | None:
    """The clients' training label counts as their nodes reported them at start (``label-counts`` of the
    start-up query's answers, by node or by client): row ``i`` is client ``i``'s (partition id ``i``), zeros
    where no answer came from client ``i`` of the federation's ``num-partitions``. ``None``: no client
    reported counts (another ClientApp)."""
    reported = {int(a["partition-id"]): list(a["label-counts"]) for a in info.values()
                if "partition-id" in a and isinstance(a.get("label-counts"), list) and a["label-counts"]}
    if not reported:
        return None
    clients = max(max(reported) + 1, *(int(a.get("num-partitions", 0)) for a in info.values()))
    table = np.zeros((clients, max(len(c) for c in reported.values())), dtype=np.int64)
    for client, counts in reported.items():
        table[client, :len(counts)] = counts
    return table


def plot_partition(counts: np.ndarray, path: Path, title: str = "") -> None:
    """Each client's training label counts (``counts``: clients x classes, ``label_counts``), drawn by Flower
    Datasets' ``plot_label_distributions`` over a ``CountsPartitioner`` of them: a stacked bar per client,
    or, beyond ``BAR_CLIENTS`` clients or ``BAR_LABELS`` classes, a heatmap of clients by labels; the first
    ``MAX_PARTITION_CLIENTS`` clients at most, as the title says. Needs Flower Datasets (the ``data`` extra)."""
    require("flwr_datasets", why=f"the partition figure, {path.name}")
    plt, _ = _pyplot()  # before Flower Datasets imports pyplot: no window
    from flwr_datasets.visualization import plot_label_distributions

    from flower_pfl.reports.counts_partitioner import LABEL, CountsPartitioner

    clients, classes = counts.shape
    shown = min(clients, MAX_PARTITION_CLIENTS)
    what = (f"training labels of each of {counted(clients, 'client')}" if shown == clients
            else f"training labels of the first {shown} of {clients} clients")
    bars = shown <= BAR_CLIENTS and classes <= BAR_LABELS
    width = min(max(6.4, (0.3 if bars else 0.02) * shown + 3), 18)
    height = 4.8 if bars else min(max(3.5, 0.22 * classes + 2), 10)
    fig, ax = plt.subplots(figsize=(width, height), dpi=110)
    plot_label_distributions(CountsPartitioner(counts), LABEL, plot_type="bar" if bars else "heatmap",
                             max_num_partitions=shown, axis=ax, title=_rewrap(f"{title}: {what}" if title else what, int(width * 14)),
                             legend=True, legend_title="label" if bars else "training samples",
                             legend_kwargs={"loc": "center right", "bbox_to_anchor": (1, 0.5), "fontsize": 8} if bars else None,
                             plot_kwargs=None if bars else {"xticklabels": -(-shown // 25), "yticklabels": -(-classes // 30)})
    ax.set_xlabel("client (partition id)")
    ax.set_ylabel("training samples" if bars else "label")
    ax.title.set_fontsize(9)
    fig.tight_layout(rect=(0, 0, 1 - 0.9 / width, 1) if bars else (0, 0, 1, 1))
    _save(fig, path)


# --- client-by-client matrices --------------------------------------------------------------------

def grouped_order(groups: Sequence[Any], tiebreak: Sequence[Any] | None = None) -> list[int]:
    """Indices that put clients of the same group next to each other: by group, then ``tiebreak``
    (e.g. partition id), then original position."""
    tiebreak = list(tiebreak) if tiebreak is not None else [0] * len(groups)
    return sorted(range(len(groups)), key=lambda i: (groups[i], tiebreak[i], i))


def group_spans(groups: Sequence[Hashable]) -> list[tuple[int, int, Hashable]]:
    """``(start, stop, group)`` of each run of equal consecutive groups (clients already ordered)."""
    spans: list[tuple[int, int, Hashable]] = []
    for i, g in enumerate(groups):
        if spans and spans[-1][2] == g:
            spans[-1] = (spans[-1][0], i + 1, g)
        else:
            spans.append((i, i + 1, g))
    return spans


def group_boundaries(groups: Sequence[Hashable]) -> list[float]:
    """Cell-edge positions between consecutive groups (where separators go)."""
    return [stop - 0.5 for _, stop, _ in group_spans(groups)[:-1]]


def off_diagonal(matrix: np.ndarray) -> np.ndarray:
    """The matrix as floats with its diagonal NaN (so a colour scale covers the other pairs only)."""
    m = np.array(matrix, dtype=float)
    np.fill_diagonal(m, np.nan)
    return m


def _group_name(group: Hashable) -> str:
    return ",".join(map(str, group)) if isinstance(group, tuple) else str(group)


def _frame(ax: Any, n: int, groups: Sequence[Hashable] | None, group_label: str, max_ticks: int = 30) -> None:
    """Separators between groups, one tick per group at its centre, diagonal cells and axis labels."""
    from matplotlib.patches import Rectangle

    for i in range(n):
        ax.add_patch(Rectangle((i - 0.5, i - 0.5), 1, 1, facecolor=DIAGONAL_COLOUR, edgecolor="none", zorder=2))
    if groups is not None:
        for b in group_boundaries(groups):
            ax.axhline(b, zorder=3, **SEPARATOR)
            ax.axvline(b, zorder=3, **SEPARATOR)
        spans = group_spans(groups)
        if len(spans) <= max_ticks:
            centres = [(a + b - 1) / 2 for a, b, _ in spans]
            names = [_group_name(g) for _, _, g in spans]
            ax.set_xticks(centres, names, rotation=90 if max(map(len, names)) > 2 else 0, fontsize=7)
            ax.set_yticks(centres, names, fontsize=7)
        else:
            ax.set_xticks([]), ax.set_yticks([])
        ax.tick_params(length=0)
        ax.set(xlabel=f"other client (grouped by {group_label})", ylabel=f"client (grouped by {group_label})")
    else:
        ax.set(xlabel="other client", ylabel="client")


def draw_client_matrix(fig: Any, ax: Any, matrix: np.ndarray, colorbar_label: str, groups: Sequence[Hashable] | None = None,
                       group_label: str = "label set", cmap: str = "viridis", mark: float | None = None) -> bool:
    """A heatmap of ``matrix`` (rows: clients; columns: the other clients in the same order) whose
    colour scale covers the off-diagonal pairs; the diagonal is drawn in a neutral grey, NaN pairs
    are hatched. ``mark`` draws a line at that value on the colour bar (e.g. a threshold).
    Returns whether any pair was NaN (for the legend)."""
    from matplotlib.patches import Rectangle

    m = off_diagonal(matrix)
    n = len(m)
    finite = m[np.isfinite(m)]
    vmin, vmax = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    ax.add_patch(Rectangle((-0.5, -0.5), n, n, facecolor="white", edgecolor="0.6", hatch=MISSING_HATCH, lw=0, zorder=0))
    im = ax.imshow(np.ma.masked_invalid(m), cmap=cmap, vmin=vmin, vmax=vmax if vmax > vmin else vmin + 1e-9,
                   interpolation="nearest", zorder=1)
    bar = fig.colorbar(im, ax=ax, fraction=0.046, pad=0.03)
    bar.set_label(colorbar_label, fontsize=8)
    if mark is not None and vmin <= mark <= vmax:
        bar.ax.axhline(mark, color="red", lw=1.5)
    _frame(ax, n, groups, group_label)
    return bool((np.isnan(m) & ~np.eye(n, dtype=bool)).any())


def draw_selection_mask(ax: Any, mask: np.ndarray, groups: Sequence[Hashable] | None = None, group_label: str = "label") -> None:
    """A binary client-by-client mask in two colours (not selected / selected), diagonal apart."""
    from matplotlib.colors import BoundaryNorm, ListedColormap

    m = off_diagonal(np.asarray(mask, dtype=float))
    ax.imshow(np.ma.masked_invalid(m), cmap=ListedColormap(MASK_COLOURS), norm=BoundaryNorm([-0.5, 0.5, 1.5], 2),
              interpolation="nearest", zorder=1)
    _frame(ax, len(m), groups, group_label)


def legend_handles(diagonal: str, missing: str | None = None, separators: bool = True,
                   mask: tuple[str, str] | None = None) -> list[Any]:
    """Legend entries for ``draw_client_matrix`` / ``draw_selection_mask`` figures."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    out: list[Any] = []
    if mask is not None:
        out += [Patch(facecolor=MASK_COLOURS[1], label=mask[1]), Patch(facecolor=MASK_COLOURS[0], edgecolor="0.7", label=mask[0])]
    out.append(Patch(facecolor=DIAGONAL_COLOUR, label=diagonal))
    if missing:
        out.append(Patch(facecolor="white", edgecolor="0.6", hatch=MISSING_HATCH, label=missing))
    if separators:
        out.append(Line2D([], [], label="boundary between groups", **SEPARATOR))
    return out


def _pyplot() -> tuple[Any, Any]:
    require("matplotlib", why="figures")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    return plt, MaxNLocator


def new_figure(panels: int, width: float = 4.8, height: float = 4.6, max_columns: int = 3) -> tuple[Any, list[Any]]:
    """A figure with ``panels`` square-ish axes, at most ``max_columns`` a row."""
    plt, _ = _pyplot()
    cols = min(panels, max_columns)
    rows = -(-panels // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(max(width * cols, 7.0), height * rows + 1.6), dpi=110, squeeze=False)
    for ax in axes.flat[panels:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:panels])


def finish_figure(fig: Any, path: Path, title: str, handles: Sequence[Any]) -> None:
    """Title above (lines wrapped to the figure's width), the legend below, saved and closed."""
    width = fig.get_figwidth()
    fig.suptitle(_rewrap(title, int(width * 14)), fontsize=9)
    ncol = max(1, min(len(handles), int(width // 3.2)))
    fig.legend(handles=list(handles), loc="lower center", ncol=ncol, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, (0.25 + 0.22 * math.ceil(len(handles) / ncol)) / fig.get_figheight(), 1, 1))
    _save(fig, path)


def _rewrap(text: str, width: int) -> str:
    """Each line of ``text`` wrapped at spaces (never inside a hyphenated key) to ``width`` characters."""
    return "\n".join(part for line in text.splitlines() for part in textwrap.wrap(line, width, break_on_hyphens=False) or [""])


def _save(fig: Any, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.savefig(path)
    plt.close(fig)
