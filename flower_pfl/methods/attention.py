"""Aggregation math shared by the attention-based methods: pure, vectorized tensor functions.

All functions take the round's participants as one ``(m, d)`` matrix ``U`` (one
flat model per row) and never loop over client pairs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

_EPS = 1e-12
#: the column blocks ``squared_distances`` centres at a time (bytes): small enough to stay in cache
_CHUNK_BYTES = 1 << 22


def cosine_similarity_matrix(x: torch.Tensor) -> torch.Tensor:
    """``(m, m)`` cosine similarities of the rows of ``x``: one GEMM ``x xᵀ`` divided by the rows'
    norms on both sides (no normalized copy of ``x``; ``x`` may be a column slice of a larger matrix).

    An all-zero row has similarity 0 with every row (including itself).
    """
    norms = x.norm(dim=1).clamp_min(_EPS)
    return (x @ x.T).div_(norms[:, None]).div_(norms[None, :]).clamp_(-1.0, 1.0)


def layerwise_attention(
    u: torch.Tensor, components: Sequence[slice], sigma: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """FedMCSA's model-components self-attention (Guo et al., eqs. 6-8).

    For every component (layer) ``l`` separately::

        psi[l, i, k] = softmax_k( sigma * cos(theta_{i,l}, theta_{k,l}) )   # eq. (7), row softmax
        w_{i,l}      = sum_k psi[l, i, k] * theta_{k,l}                      # eq. (6)

    Eq. (7) prints the denominator with index ``k``; the text requires the weights
    of row ``i`` to sum to 1, so this is a row softmax. The softmax subtracts the
    row maximum, so any ``sigma`` is numerically safe.

    Args:
        u: ``(m, d)`` models of the round's participants.
        components: column slices of the components, covering ``[0, d)``.
        sigma: scale of the similarity, ``> 0``. ``sigma -> 0`` gives the uniform
            per-layer mean; large ``sigma`` gives every client its own layer back.

    Returns:
        ``(V, psi)``: the ``(m, d)`` personalized models and the ``(L, m, m)``
        attention weights.
    """
    if sigma <= 0:
        raise ValueError(f"sigma must be > 0, got {sigma}")
    covered = sum(sl.stop - sl.start for sl in components)
    if covered != u.shape[1]:
        raise ValueError(f"components cover {covered} of {u.shape[1]} columns")
    out = torch.empty_like(u)
    weights = u.new_empty((len(components), u.shape[0], u.shape[0]))
    for l, sl in enumerate(components):
        block = u[:, sl]
        weights[l] = torch.softmax(sigma * cosine_similarity_matrix(block), dim=1)
        torch.mm(weights[l], block, out=out[:, sl])  # straight into the output's columns
    return out, weights


def quantile_threshold_weights(similarity: torch.Tensor, p: float) -> tuple[torch.Tensor, torch.Tensor, float]:
    """FedACS's thresholded similarity weights (Chen, Li, Shen, eq. 4).

    ``delta`` is the ``p``-quantile of all entries of the ``(m, m)`` similarity
    matrix ``S`` (diagonal included), recomputed from each round's ``S``. Client
    ``j`` contributes to row ``i`` iff ``s_ij > delta`` and ``s_ij > 0``, with weight
    ``s_ij`` normalised over the row; a client always keeps itself (eq. 4 relies on
    ``s_ii = 1 > delta``; here it also holds for ``delta = 1``). Negative
    similarities are never kept: eq. 4 with a negative ``s_ij`` would give a
    negative weight and could make the row sum vanish.

    Returns ``(weights, mask, delta)``; every row of ``weights`` sums to 1.
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p must be in [0, 1], got {p}")
    delta = float(torch.quantile(similarity.flatten().to(torch.float64), p))
    eye = torch.eye(similarity.shape[0], dtype=torch.bool, device=similarity.device)
    mask = ((similarity > delta) & (similarity > 0)) | eye
    weights = torch.where(mask, similarity.clamp_min(0), torch.zeros_like(similarity))
    weights = torch.where(eye, torch.ones_like(weights), weights)  # s_ii = 1 (also for all-zero rows)
    return weights / weights.sum(dim=1, keepdim=True), mask, delta


def fedamp_weights(u: torch.Tensor, alpha_k: float, sigma: float) -> torch.Tensor:
    """FedAMP's message-passing weights (Huang et al. 2021): for ``j != i``
    ``xi_ij = alpha_k * A'(||w_i - w_j||^2)`` with ``A'(x) = exp(-x / sigma) / sigma`` (the
    derivative of the attention-inducing ``A(x) = 1 - exp(-x / sigma)``), and
    ``xi_ii = 1 - sum_{j != i} xi_ij``. Rows sum to 1.

    The distances come from ``squared_distances``: products in the models' own dtype of the rows
    centred at their mean (the common part cancels before the product, so float32 keeps the
    distances' precision), summed in float64.

    Raises ``ValueError`` when a self weight would be negative (``alpha_k`` too large for ``sigma``).
    """
    d2 = squared_distances(u)
    xi = alpha_k * torch.exp(-d2 / sigma) / sigma
    xi.fill_diagonal_(0.0)
    self_weight = 1.0 - xi.sum(1)
    if (self_weight < 0).any():
        raise ValueError(f"FedAMP's self weight 1 - sum_j xi_ij is negative (min {float(self_weight.min()):.3g}): "
                         f"alpha_k = {alpha_k} is too large for sigma = {sigma}")
    return (xi + torch.diag(self_weight)).to(u.dtype)


def squared_distances(x: torch.Tensor, chunk_bytes: int = _CHUNK_BYTES) -> torch.Tensor:
    """``(m, m)`` squared Euclidean distances between the rows of ``x`` in float64,
    ``||c_i||² + ||c_j||² − 2 c_i·c_j`` with ``c`` the rows centred at their mean (distances do not
    change under a shift), clamped at 0 and exactly 0 on the diagonal.

    The rows are centred a block of columns (about ``chunk_bytes``) at a time, in ``x``'s dtype, and
    the blocks' Gram matrices and squared norms are summed in float64: no centred copy of ``x`` is
    made, and the sum over blocks adds no float32 rounding."""
    m, d = x.shape
    mean = x.mean(0)
    gram = x.new_zeros((m, m), dtype=torch.float64)
    sq = x.new_zeros(m, dtype=torch.float64)
    step = max(1, min(d, chunk_bytes // max(1, m * x.element_size())))
    centred, squares = x.new_empty((m, step)), x.new_empty((m, step))  # reused by every block
    for start in range(0, d, step):
        width = min(step, d - start)
        block = torch.sub(x[:, start:start + width], mean[start:start + width], out=centred[:, :width])
        gram += block @ block.T
        sq += torch.mul(block, block, out=squares[:, :width]).sum(1)
    d2 = (sq[:, None] + sq[None, :] - 2.0 * gram).clamp_min_(0.0)
    return d2.fill_diagonal_(0.0)


def heuristic_fedamp_weights(u: torch.Tensor, sigma: float, self_weight: float) -> torch.Tensor:
    """HeurFedAMP: ``xi_ii = self_weight``; for ``j != i``, ``xi_ij`` proportional to
    ``exp(sigma * cos(w_i, w_j))`` and scaled so the row sums to 1. With one participant
    the row is ``[1]``."""
    m = u.shape[0]
    if m == 1:
        return torch.ones(1, 1, dtype=u.dtype, device=u.device)
    scores = sigma * cosine_similarity_matrix(u)
    scores.fill_diagonal_(float("-inf"))
    return torch.softmax(scores, dim=1) * (1.0 - self_weight) + self_weight * torch.eye(m, dtype=u.dtype, device=u.device)
