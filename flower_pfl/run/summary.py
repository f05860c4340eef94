"""A run's figures from its evaluated rounds: the best mean test accuracy over rounds (BMTA,
FedMCSA's figure) and the mean over the last 10% of rounds (IGFL's figure), for the clients'
personalized models and, where a method has one, its global model."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from flower_pfl.engine.client_metrics import GLOBAL_ACCURACY


def summarize_run(history: Sequence[Mapping[str, float]], num_rounds: int, accuracy_key: str = "accuracy") -> dict[str, float]:
    """Run summary from evaluated rounds (``round_metrics`` rows with a ``round``).

    ``bmta`` is the best ``<key>-mean`` over rounds (FedMCSA's figure), ``bmta_weighted`` the best
    sample-weighted ``<key>``; ``last10_*`` averages the evaluations in the last 10% of
    ``num_rounds`` (IGFL's figure; at least the final evaluation).
    """
    history = [h for h in history if f"{accuracy_key}-mean" in h]
    if not history:
        raise ValueError(f"no evaluated round with '{accuracy_key}-mean' to summarize")
    rounds = np.array([h["round"] for h in history], dtype=np.int64)
    acc = np.array([h[f"{accuracy_key}-mean"] for h in history])
    wacc = np.array([h.get(accuracy_key, math.nan) for h in history])
    start = num_rounds - math.ceil(0.1 * num_rounds)
    tail = rounds > start
    if not tail.any():
        tail = rounds == rounds.max()
    best = int(acc.argmax())
    extra: dict[str, float] = {}
    glob_key = f"{GLOBAL_ACCURACY}-mean"
    if all(glob_key in h for h in history):  # methods that report their global model too (pFedMe's GM)
        gacc = np.array([h[glob_key] for h in history])
        extra = {"bmta_global": float(gacc.max()), "last10_mean_global_accuracy": float(gacc[tail].mean())}
    final = int(rounds.argmax())
    return extra | {
        "bmta": float(acc.max()),
        "bmta_round": int(rounds[best]),
        "bmta_weighted": float(wacc.max()),
        "last10_mean_accuracy": float(acc[tail].mean()),
        "last10_mean_accuracy_weighted": float(wacc[tail].mean()),
        "final_accuracy": float(acc[final]),
        "final_accuracy_std": float(history[final].get(f"{accuracy_key}-std", math.nan)),
        "evaluated_rounds": int(len(history)),
    }
