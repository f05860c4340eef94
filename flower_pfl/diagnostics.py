"""Attention diagnostics: which clients attend to which, per model component, averaged over rounds."""

from __future__ import annotations

from pathlib import Path
from typing import Hashable, Mapping, Sequence

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

    def __len__(self) -> int:
        return len(self._index)

    def add(self, ids: Sequence[Hashable], weights: Mapping[str, torch.Tensor]) -> None:
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

    def save(self, path: Path, title: str = "", rank: Mapping[Hashable, int] | None = None) -> None:
        """``<path>.npz`` (ids, rank, one matrix per component) and ``<path>.png`` (one heatmap each)."""
        ids, means = self.mean(rank)
        ranks = np.array([(rank or {}).get(cid, -1) for cid in ids])
        np.savez(path.with_suffix(".npz"), ids=np.array([str(i) for i in ids]), rank=ranks, **means)
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        order = "partition id" if rank else "first participation"
        fig, axes = plt.subplots(1, len(means), figsize=(4.6 * len(means), 4.2), dpi=110, squeeze=False)
        for ax, (name, mean) in zip(axes[0], means.items()):
            im = ax.imshow(np.ma.masked_invalid(mean), cmap="viridis", interpolation="nearest", vmin=0)
            fig.colorbar(im, ax=ax, fraction=0.046)
            ax.set(title=f"{name}  (mean self-weight {np.nanmean(np.diag(mean)):.2f})",
                   xlabel=f"attended client (by {order})", ylabel="client")
        fig.suptitle(title)
        fig.tight_layout()
        fig.savefig(path.with_suffix(".png"))
        plt.close(fig)
