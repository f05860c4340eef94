"""The squared maximum mean discrepancy (MMD) between two batches of features, with a sum of Gaussian
kernels: fixed widths (FedCP) or widths spread around the batches' mean squared distance (FedPHP)."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def squared_distances(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``||a_i − b_j||²`` for the rows of ``(n, d)`` ``a`` and ``(m, d)`` ``b``: ``(n, m)``."""
    return (a[:, None, :] - b[None, :, :]).pow(2).sum(-1)


def squared_mmd(x: torch.Tensor, y: torch.Tensor, widths: Sequence[float | torch.Tensor]) -> torch.Tensor:
    """The biased squared MMD of the samples ``x`` and ``y`` under the kernel
    ``k(a, b) = Σ_w exp(−||a − b||² / w)``: ``mean K_xx + mean K_yy − 2 mean K_xy``."""
    def kernel(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        d2 = squared_distances(a, b)
        return sum((torch.exp(-d2 / w) for w in widths), torch.zeros_like(d2))
    return kernel(x, x).mean() + kernel(y, y).mean() - 2 * kernel(x, y).mean()


def widths_around_mean_distance(x: torch.Tensor, y: torch.Tensor, kernels: int = 5, ratio: float = 2.0) -> list[torch.Tensor]:
    """``kernels`` widths ``h · ratio^(k − ⌊kernels/2⌋)``, ``h`` the mean squared distance between distinct
    points of ``x ∪ y``, held constant in the gradient (the multi-kernel MMD of Long et al.'s DAN)."""
    z = torch.cat([x, y]).detach()
    n = len(z)
    h = squared_distances(z, z).sum() / (n * n - n) + 1e-8
    return [h * ratio ** (k - kernels // 2) for k in range(kernels)]
