"""Attention diagnostics: which clients attend to which, per model component, averaged over rounds."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch


class AttentionAccumulator:
    """Running mean, per client pair, of each round's ``(m, m)`` attention weights.

    Weights come per component (``{"fc.weight": (m, m), ...}``); a client-level
    method passes a single entry. Pairs that never met in a round stay NaN.
    """

    def __init__(self) -> None:
        self._index: dict[Hashable, int] = {}
        self._sums: dict[str, torch.Tensor] = {}
        self._count = torch.zeros((0, 0), dtype=torch.float64)
        #: every round's participants and weights, in order (``save_rounds`` writes them)
        self.rounds: list[tuple[list[Hashable], dict[str, np.ndarray]]] = []

    def __len__(self) -> int:
        return len(self._index)

    @property
    def clients(self) -> list[Hashable]:
        """The clients seen so far, in order of first participation."""
        return list(self._index)

    def add(self, ids: Sequence[Hashable], weights: Mapping[str, torch.Tensor]) -> None:
        self.rounds.append((list(ids), {k: w.detach().cpu().numpy().astype(np.float32) for k, w in weights.items()}))
        for cid in ids:
            self._index.setdefault(cid, len(self._index))
        n = len(self._index)

        def grow(t: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.pad(t, (0, n - t.shape[1], 0, n - t.shape[0]))

        self._count = grow(self._count)
        idx = torch.tensor([self._index[c] for c in ids])
        rows, cols = idx[:, None], idx[None, :]
        self._count[rows, cols] += 1
        for name, w in weights.items():
            total = grow(self._sums.get(name, torch.zeros((0, 0), dtype=torch.float64)))
            total[rows, cols] += w.detach().cpu().to(torch.float64)
            self._sums[name] = total

    def get_state(self) -> dict[str, Any]:
        """Everything needed to continue accumulating (for checkpoints)."""
        return {"index": list(self._index), "sums": dict(self._sums), "count": self._count,
                "rounds": [[ids, weights] for ids, weights in self.rounds]}

    def set_state(self, state: dict[str, Any]) -> None:
        self._index = {cid: i for i, cid in enumerate(state["index"])}
        self._sums, self._count = dict(state["sums"]), state["count"]
        self.rounds = [(list(ids), dict(weights)) for ids, weights in state["rounds"]]

    def mean(self, rank: Mapping[Hashable, int] | None = None) -> tuple[list[Hashable], dict[str, np.ndarray]]:
        """Client ids (row/column order) and each component's mean weights.

        With ``rank`` (e.g. client id -> partition id) rows and columns follow it;
        otherwise the order in which clients were first seen.
        """
        ids = list(self._index)
        if rank:
            ids.sort(key=lambda cid: (rank.get(cid, np.inf), str(cid)))
        idx = torch.tensor([self._index[c] for c in ids], dtype=torch.long)
        count = self._count[idx][:, idx]
        with np.errstate(invalid="ignore", divide="ignore"):
            return ids, {name: (s[idx][:, idx] / count).numpy() for name, s in self._sums.items()}

    def save_rounds(self, path: Path) -> None:
        """``<path>.npz``: ``ids`` ``(R, m)`` (the participants of each round, rows and columns of its
        matrix; ``""`` pads rounds with fewer), ``num_participants`` ``(R,)`` and per component
        ``(R, m, m)`` weights (NaN-padded)."""
        m = max((len(ids) for ids, _ in self.rounds), default=0)
        ids = np.full((len(self.rounds), m), "", dtype=object)
        out: dict[str, np.ndarray] = {}
        for r, (round_ids, weights) in enumerate(self.rounds):
            ids[r, : len(round_ids)] = [str(c) for c in round_ids]
            for name, w in weights.items():
                out.setdefault(name, np.full((len(self.rounds), m, m), np.nan, dtype=np.float32))[r, : w.shape[0], : w.shape[1]] = w
        np.savez(path.with_suffix(".npz"), ids=ids.astype(str), num_participants=np.array([len(i) for i, _ in self.rounds]),
                 **out)  # type: ignore[arg-type]  # numpy's stub types **kwds as its keyword flags

    def save(self, path: Path, title: str = "", rank: Mapping[Hashable, int] | None = None,
             groups: Mapping[Hashable, Hashable] | None = None, group_label: str = "label set") -> None:
        """``<path>.npz`` (ids, rank, one matrix per component) and ``<path>.png`` (one heatmap each).

        ``rank`` orders rows and columns; ``groups`` (e.g. each client's label set, with ``rank``
        keeping each group together) draws separators between groups and names them on the axes.
        """
        ids, means = self.mean(rank)
        ranks = np.array([(rank or {}).get(cid, -1) for cid in ids])
        np.savez(path.with_suffix(".npz"), ids=np.array([str(i) for i in ids]), rank=ranks,
                 **means)  # type: ignore[arg-type]  # numpy's stub types **kwds as its keyword flags
        from .figures import draw_client_matrix, finish_figure, legend_handles, new_figure

        ordered = [groups.get(cid) for cid in ids] if groups else None
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
                             delta: float, labels: Sequence[int], title: str = "") -> dict[str, float]:
    """One round's similarity matrix and selection mask, clients grouped by dominant label:
    ``<path>.npz`` and ``<path>.png``. Returns ``label_grouping``'s figures."""
    from matplotlib.lines import Line2D

    from .figures import draw_client_matrix, draw_selection_mask, finish_figure, grouped_order, legend_handles, new_figure

    order = grouped_order(list(labels))
    s, m, lab = similarity[np.ix_(order, order)], mask[np.ix_(order, order)], np.asarray(labels)[order]
    stats = label_grouping(similarity, mask, labels)
    np.savez(path.with_suffix(".npz"), ids=np.array([str(ids[i]) for i in order]), labels=lab,
             similarity=s, mask=m, delta=delta)
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
