"""Attention diagnostics: which clients attend to which, averaged over rounds."""

from __future__ import annotations

from pathlib import Path
from typing import Hashable, Sequence

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

    def mean(self) -> tuple[list[Hashable], np.ndarray]:
        """Client ids (row/column order) and the mean weights (NaN where a pair never met)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return list(self._index), (self._sum / self._count).numpy()

    def save(self, path: Path, title: str = "") -> None:
        """``<path>.npz`` (ids, mean) and ``<path>.png`` (heatmap)."""
        ids, mean = self.mean()
        np.savez(path.with_suffix(".npz"), ids=np.array([str(i) for i in ids]), mean=mean)
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5.5, 4.5), dpi=120)
        im = ax.imshow(np.ma.masked_invalid(mean), cmap="viridis", interpolation="nearest")
        fig.colorbar(im, ax=ax, label="mean attention weight")
        ax.set(title=title, xlabel="attended client", ylabel="client (row sums to 1 per round)")
        fig.tight_layout()
        fig.savefig(path.with_suffix(".png"))
        plt.close(fig)
