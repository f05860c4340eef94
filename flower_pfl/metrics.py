"""Personalized evaluation metrics (DESIGN.md, "Evaluation protocol").

Per evaluated round: every client's accuracy of the model it would use on its
own test split. Per run: best mean test accuracy over rounds (BMTA, FedMCSA's
figure) and the mean over the last 10% of rounds (IGFL's figure).
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np


def round_metrics(accuracy: Sequence[float], num_examples: Sequence[int], loss: Sequence[float] | None = None) -> dict[str, float]:
    """Aggregate one round's per-client results.

    ``accuracy`` is the unweighted mean over clients (the papers' "mean test
    accuracy"), ``accuracy_weighted`` weights clients by their test samples,
    ``accuracy_std`` is the (population) std over clients.
    """
    acc = np.asarray(accuracy, dtype=np.float64)
    n = np.asarray(num_examples, dtype=np.float64)
    if acc.size == 0 or acc.shape != n.shape:
        raise ValueError("need one accuracy and one sample count per client")
    out = {
        "accuracy": float(acc.mean()),
        "accuracy_weighted": float((acc * n).sum() / max(n.sum(), 1.0)),
        "accuracy_std": float(acc.std()),
        "accuracy_min": float(acc.min()),
        "num_clients": float(acc.size),
    }
    if loss is not None:
        out["loss"] = float(np.asarray(loss, dtype=np.float64).mean())
    return out


#: a client's accuracy of the global model, reported beside its personalized one (pFedMe's GM)
GLOBAL_ACCURACY = "global-accuracy"


def summarize_run(history: Sequence[Mapping[str, float]], num_rounds: int) -> dict[str, float]:
    """Run summary from evaluated rounds (dicts with ``round`` and ``round_metrics`` keys).

    ``last10_*`` averages the evaluations in the last 10% of ``num_rounds``
    (at least the final evaluation).
    """
    if not history:
        raise ValueError("no evaluated round to summarize")
    rounds = np.array([h["round"] for h in history], dtype=np.int64)
    acc = np.array([h["accuracy"] for h in history])
    wacc = np.array([h["accuracy_weighted"] for h in history])
    start = num_rounds - math.ceil(0.1 * num_rounds)
    tail = rounds > start
    if not tail.any():
        tail = rounds == rounds.max()
    best = int(acc.argmax())
    extra: dict[str, float] = {}
    if all("global_accuracy" in h for h in history):  # methods that report their global model too (pFedMe's GM)
        gacc = np.array([h["global_accuracy"] for h in history])
        extra = {"bmta_global": float(gacc.max()), "last10_mean_global_accuracy": float(gacc[tail].mean())}
    return extra | {
        "bmta": float(acc.max()),
        "bmta_round": int(rounds[best]),
        "bmta_weighted": float(wacc.max()),
        "last10_mean_accuracy": float(acc[tail].mean()),
        "last10_mean_accuracy_weighted": float(wacc[tail].mean()),
        "final_accuracy": float(acc[rounds.argmax()]),
        "final_accuracy_std": float(history[int(rounds.argmax())].get("accuracy_std", float("nan"))),
        "evaluated_rounds": int(len(history)),
    }
