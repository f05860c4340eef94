"""Synthetic(alpha, beta): the FedProx / pFedMe / FedMCSA benchmark, seeded.

Per user ``i`` (``alpha``, ``beta`` are standard deviations, as numpy's ``normal``):

    n_i        = (int(lognormal(4, 2)) + 50) * 5
    mean_W_i   ~ N(0, alpha);  mean_b_i = mean_W_i;  B_i ~ N(0, beta)
    v_i        ~ N(B_i, 1)^60
    x          ~ N(v_i, diag((j + 1)^-1.2))
    W_i        ~ N(mean_W_i, 1)^(60 x 10);  b_i ~ N(mean_b_i, 1)^10
    y          = argmax(x W_i + b_i)          (= argmax of the softmax)

Every random draw comes from one ``numpy.random.Generator`` seeded by ``seed``,
so the same arguments always give the same data.
"""

from __future__ import annotations

import numpy as np

DIM = 60
NUM_CLASSES = 10


def generate_synthetic(
    alpha: float = 0.5,
    beta: float = 0.5,
    num_users: int = 100,
    seed: int = 0,
    dim: int = DIM,
    num_classes: int = NUM_CLASSES,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per user ``(x, y)``: ``x`` float32 of shape ``(n_i, dim)``, ``y`` int64 labels."""
    if alpha < 0 or beta < 0:
        raise ValueError("alpha and beta must be >= 0")
    if num_users < 1:
        raise ValueError("num_users must be >= 1")
    rng = np.random.default_rng(seed)
    samples = (rng.lognormal(4, 2, num_users).astype(int) + 50) * 5
    mean_w = rng.normal(0, alpha, num_users)
    mean_b = mean_w
    big_b = rng.normal(0, beta, num_users)
    std_x = np.sqrt(np.power(np.arange(1, dim + 1, dtype=np.float64), -1.2))
    mean_x = rng.normal(big_b[:, None], 1, (num_users, dim))
    users = []
    for i in range(num_users):
        w = rng.normal(mean_w[i], 1, (dim, num_classes))
        b = rng.normal(mean_b[i], 1, num_classes)
        x = mean_x[i] + rng.standard_normal((samples[i], dim)) * std_x
        y = np.argmax(x @ w + b, axis=1)
        users.append((x.astype(np.float32), y.astype(np.int64)))
    return users
