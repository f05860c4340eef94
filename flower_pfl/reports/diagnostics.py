"""Diagnostics of a run, drawn and summarised: which clients attend to which (per model component,
averaged over rounds), how often a client's strongest attention falls on a client with the same
labels, and a method's last-round similarity and selection mask."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from flower_pfl.engine.attention_log import AttentionAccumulator, RecordsAttention, ReportsSimilarity
from flower_pfl.engine.server_algorithm import ServerAlgorithm
from flower_pfl.reports.figures import (
    draw_client_matrix,
    draw_selection_mask,
    finish_figure,
    grouped_order,
    legend_handles,
    new_figure,
)


def save_attention(log: AttentionAccumulator, path: Path, title: str = "", rank: Mapping[Hashable, int] | None = None,
                   groups: Mapping[Hashable, Hashable] | None = None, group_label: str = "label set", figure: bool = True) -> None:
    """``<path>.npz`` (ids, rank, one matrix per component) and, with ``figure``, ``<path>.png`` (a heatmap each,
    ``MAX_PANELS`` at most).

    ``rank`` orders rows and columns; ``groups`` (e.g. each client's label set, with ``rank``
    keeping each group together) draws separators between groups and names them on the axes.
    """
    ids, means = log.mean(rank)
    ranks = np.array([(rank or {}).get(cid, -1) for cid in ids])
    np.savez(path.with_suffix(".npz"), ids=np.array([str(i) for i in ids]), rank=ranks,
             **means)  # type: ignore[arg-type]  # numpy's stub types **kwds as its keyword flags
    if not figure:
        return
    ordered = [groups.get(cid) for cid in ids] if groups else None
    shown = shown_components(list(means))
    if len(shown) < len(means):
        title = f"{title}\n{len(shown)} of the {len(means)} components, evenly spaced (all of them in {path.with_suffix('.npz').name})"
    means = {name: means[name] for name in shown}
    fig, axes = new_figure(len(means))
    missing = False
    for ax, (name, mean) in zip(axes, means.items()):
        missing |= draw_client_matrix(fig, ax, mean, "mean attention weight (row: client, column: attended)",
                                      ordered, group_label)
        ax.set_title(f"{name}  (mean self-weight {np.nanmean(np.diag(mean)):.2f})", fontsize=9)
    handles = legend_handles("diagonal: a client's weight on itself (outside the colour scale)",
                             "never in the same round (no weight)" if missing else None, separators=bool(ordered))
    finish_figure(fig, path.with_suffix(".png"), f"{title}\nmean attention weight over the rounds each pair of clients met in"
                  if title else "mean attention weight over the rounds each pair of clients met in", handles)




#: the most components a figure of attention weights shows, and the summary reports (a ResNet has over a hundred)
MAX_PANELS = 12


def shown_components(names: Sequence[str], most: int = MAX_PANELS) -> list[str]:
    """``names`` when there are at most ``most``, else ``most`` of them evenly spaced, the first and last included."""
    if len(names) <= most:
        return list(names)
    return [names[i] for i in dict.fromkeys(np.linspace(0, len(names) - 1, most).round().astype(int).tolist())]


def label_set(counts: Sequence[int], min_share: float = 0.1) -> tuple[int, ...]:
    """The labels that make up at least ``min_share`` of a client's training data."""
    c = np.asarray(counts, dtype=float)
    total = c.sum()
    return tuple(int(i) for i in np.flatnonzero(c >= min_share * total)) if total > 0 else ()


def strongest_partner_agreement(mean: np.ndarray, groups: Sequence[Hashable]) -> dict[str, float]:
    """How often each client's strongest off-diagonal attention falls on a client of its own
    group (e.g. the same label set; IGFL's Figure 2 check, where the paper reports 96%).

    ``mean``: ``(n, n)`` attention averaged over rounds (NaN for pairs that never met);
    ``groups[i]``: client ``i``'s group. ``chance`` is the same rate for a partner drawn
    uniformly from the clients each row met.
    """
    m = np.array(mean, dtype=float)
    np.fill_diagonal(m, np.nan)
    index: dict[Hashable, int] = {}
    g = np.array([index.setdefault(x, len(index)) for x in groups])
    same = g[:, None] == g[None, :]
    hits, chance, rows = 0, 0.0, 0
    for i in range(len(g)):
        met = np.isfinite(m[i])
        if not met.any():
            continue
        rows += 1
        hits += bool(same[i, int(np.nanargmax(m[i]))])
        chance += float(same[i, met].mean())
    if not rows:
        return {"strongest_same_group": float("nan"), "chance_same_group": float("nan"), "clients": 0}
    return {"strongest_same_group": hits / rows, "chance_same_group": chance / rows, "clients": rows}


def label_grouping(similarity: np.ndarray, mask: np.ndarray, labels: Sequence[int]) -> dict[str, float]:
    """Does the selection find clients with the same (dominant) label?

    ``kept_same_label``: share of the kept off-diagonal pairs whose two clients share
    their dominant label; ``chance_same_label``: the same share over all off-diagonal
    pairs (what a selection blind to the data would give).
    """
    lab = np.asarray(labels)
    same = lab[:, None] == lab[None, :]
    off = ~np.eye(len(lab), dtype=bool)
    kept = mask & off
    return {
        "kept_same_label": float(same[kept].mean()) if kept.any() else float("nan"),
        "chance_same_label": float(same[off].mean()) if off.any() else float("nan"),
        "kept_pairs": int(kept.sum()),
        "mean_similarity_same_label": float(similarity[same & off].mean()) if (same & off).any() else float("nan"),
        "mean_similarity_other_label": float(similarity[~same].mean()) if (~same).any() else float("nan"),
    }


def save_similarity_snapshot(path: Path, ids: Sequence[Hashable], similarity: np.ndarray, mask: np.ndarray,
                             delta: float, labels: Sequence[int], title: str = "", figure: bool = True) -> dict[str, float]:
    """One round's similarity matrix and selection mask, clients grouped by dominant label:
    ``<path>.npz`` and, with ``figure``, ``<path>.png``. Returns ``label_grouping``'s figures."""
    order = grouped_order(list(labels))
    s, m, lab = similarity[np.ix_(order, order)], mask[np.ix_(order, order)], np.asarray(labels)[order]
    stats = label_grouping(similarity, mask, labels)
    np.savez(path.with_suffix(".npz"), ids=np.array([str(ids[i]) for i in order]), labels=lab,
             similarity=s, mask=m, delta=delta)
    if not figure:
        return stats
    from matplotlib.lines import Line2D  # matplotlib is imported only when a figure is drawn

    groups = [int(x) for x in lab]
    fig, (left, right) = new_figure(2)
    draw_client_matrix(fig, left, s, "cosine similarity of the two clients' models", groups, "dominant label", mark=delta)
    left.set_title(f"similarity s (threshold δ = {delta:.3f})", fontsize=9)
    draw_selection_mask(right, m, groups, "dominant label")
    right.set_title("selection: s > δ", fontsize=9)
    handles = legend_handles("diagonal: a client with itself (outside the scale; always kept)",
                             mask=("not selected (s ≤ δ)", "selected (s > δ)"))
    handles.append(Line2D([], [], color="red", lw=1.5, label="δ on the colour bar"))
    finish_figure(fig, path.with_suffix(".png"),
                  f"{title}\nlast round: same-dominant-label share of selected pairs {stats['kept_same_label']:.2f} "
                  f"(chance {stats['chance_same_label']:.2f})", handles)
    return stats


def save_run_diagnostics(method: ServerAlgorithm, participants: Sequence[Hashable], info: Mapping[int, Mapping[str, Any]],
                         out: Path, title: str, figures: bool = True) -> dict[str, Any]:
    """A finished run's diagnostics in its results folder ``out``: the attention heatmaps averaged
    over rounds (clients ordered by their label set, then partition id) with how often each client's
    strongest attention falls on a client with the same labels, and a method's last-round
    similarity and selection (``ReportsSimilarity``) among ``participants``. ``info``:
    what each node reported at start (``label-counts``, ``partition-id``, ``dominant-label``);
    ``figures``: draw the heatmaps (the data files are written either way). Returns figures for the summary."""
    def about(key: Any) -> Mapping[str, Any]:
        return info.get(int(key), {})

    extra: dict[str, Any] = {}
    attention = method.attention_weights if isinstance(method, RecordsAttention) else None
    if attention is not None and len(attention):
        ids = attention.clients
        labels = {cid: label_set(about(cid).get("label-counts", [])) for cid in ids}
        order = [ids[i] for i in grouped_order([labels[c] for c in ids], [about(c).get("partition-id", -1) for c in ids])]
        rank = {c: i for i, c in enumerate(order)}
        attention.save_rounds(out / "attention_rounds")
        save_attention(attention, out / "attention", title=title, rank=rank, groups=labels, figure=figures)
        ordered, means = attention.mean(rank)
        for name in shown_components(list(means)):
            mean = means[name]
            stats = strongest_partner_agreement(mean, [labels[c] for c in ordered])
            extra[f"attention_{name}_strongest_same_labels"] = stats["strongest_same_group"]
            extra[f"attention_{name}_chance_same_labels"] = stats["chance_same_group"]
    snapshot = method.similarity_snapshot() if isinstance(method, ReportsSimilarity) else None
    if snapshot is None or not participants:
        return extra
    stats = save_similarity_snapshot(out / "similarity_last_round", participants, snapshot.similarity.cpu().numpy(),
                                     snapshot.mask.cpu().numpy(), snapshot.threshold,
                                     [about(cid).get("dominant-label", -1) for cid in participants], title=title, figure=figures)
    return extra | {f"last_round_{k}": v for k, v in stats.items()}
