"""Attention diagnostics: which clients attend to which, averaged over rounds."""

from __future__ import annotations

from pathlib import Path
from typing import Hashable, Mapping, Sequence

import numpy as np
import torch


class AttentionAccumulator:
    """Running mean of the ``(m, m)`` attention weights of each round, per client pair.

    Pairs that never met in a round stay NaN in ``mean()``.
    """

    def __init__(self) -> None:
        self._index: dict[Hashable, int] = {}
        self._sum = torch.zeros((0, 0), dtype=torch.float64)
        self._count = torch.zeros((0, 0), dtype=torch.float64)

    def __len__(self) -> int:
        return len(self._index)

    def add(self, ids: Sequence[Hashable], weights: torch.Tensor) -> None:
        for cid in ids:
            self._index.setdefault(cid, len(self._index))
        n = len(self._index)
        if n > self._sum.shape[0]:
            grow = lambda t: torch.nn.functional.pad(t, (0, n - t.shape[1], 0, n - t.shape[0]))  # noqa: E731
            self._sum, self._count = grow(self._sum), grow(self._count)
        idx = torch.tensor([self._index[c] for c in ids])
        rows, cols = idx[:, None], idx[None, :]
        self._sum[rows, cols] += weights.detach().cpu().to(torch.float64)
        self._count[rows, cols] += 1

    def mean(self, rank: Mapping[Hashable, int] | None = None) -> tuple[list[Hashable], np.ndarray]:
        """Client ids (row/column order) and the mean weights (NaN where a pair never met).

        With ``rank`` (e.g. client id -> partition id) rows and columns follow it;
        otherwise the order in which clients were first seen.
        """
        ids = list(self._index)
        if rank:
            ids.sort(key=lambda cid: (rank.get(cid, np.inf), str(cid)))
        idx = torch.tensor([self._index[c] for c in ids], dtype=torch.long)
        with np.errstate(invalid="ignore", divide="ignore"):
            return ids, (self._sum[idx][:, idx] / self._count[idx][:, idx]).numpy()

    def save(self, path: Path, title: str = "", rank: Mapping[Hashable, int] | None = None) -> None:
        """``<path>.npz`` (ids, their rank, mean) and ``<path>.png`` (heatmap), ordered by ``rank``."""
        ids, mean = self.mean(rank)
        ranks = np.array([(rank or {}).get(cid, -1) for cid in ids])
        np.savez(path.with_suffix(".npz"), ids=np.array([str(i) for i in ids]), rank=ranks, mean=mean)
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5.5, 4.5), dpi=120)
        im = ax.imshow(np.ma.masked_invalid(mean), cmap="viridis", interpolation="nearest")
        fig.colorbar(im, ax=ax, label="mean attention weight")
        order = "partition id" if rank else "first participation"
        ax.set(title=title, xlabel=f"attended client (by {order})", ylabel="client (each round's row sums to 1)")
        fig.tight_layout()
        fig.savefig(path.with_suffix(".png"))
        plt.close(fig)
