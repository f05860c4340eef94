"""A run's figures from its evaluated rounds: the best mean test accuracy over rounds (BMTA,
FedMCSA's figure, chosen on the test data itself) and the mean over the last 10% of rounds (IGFL's
figure), for the clients' personalized models and, where a method has one, its global model; with a
validation part, the test figures of the round chosen on validation; the fairness over clients, the
clients that never trained and the rounds to a target accuracy (docs/evaluation.md)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from flower_pfl.engine.client_metrics import GLOBAL_ACCURACY, UNSEEN, VALIDATION


def summarize_run(history: Sequence[Mapping[str, float]], num_rounds: int, accuracy_key: str = "accuracy",
                  target: float = 0.0) -> dict[str, Any]:
    """Run summary from evaluated rounds (``round_metrics`` rows with a ``round``).

    ``bmta`` is the best ``<key>-mean`` over rounds (FedMCSA's figure), ``bmta_weighted`` the best
    sample-weighted ``<key>``; ``last10_*`` averages the evaluations in the last 10% of
    ``num_rounds`` (IGFL's figure; at least the final evaluation); ``selected``'s figures (validation,
    fairness, new clients) and, with a ``target`` above 0, ``rounds_to_target``.
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
    extra |= selected(history, final, accuracy_key) | rounds_to_target(history, target, accuracy_key)
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


#: what each way of picking a round of the summary chose it on
SELECTION = {"bmta": "the best round on the test data itself (the papers' figure)",
             "val_selected": "the round with the best validation mean (val-accuracy-mean); its test figures"}


def _pick(history: Sequence[Mapping[str, Any]], key: str) -> int | None:
    """The first row with the highest ``key`` (``None`` where a row lacks it)."""
    if not history or any(key not in h for h in history):
        return None
    values = [float(h[key]) for h in history]
    return values.index(max(values))


def selected(history: Sequence[Mapping[str, Any]], final: int, key: str = "accuracy") -> dict[str, Any]:
    """The figures of the reported round: the round chosen on validation where the rows have ``val-<key>-mean``
    (its test ``<key>-mean`` and ``<key>``: ``val_selected_*``), else the BMTA round. There: the bottom decile
    and 10th percentile over clients and, where clients never trained, their figures and the participation
    gap; the bottom decile and 10th percentile at the ``final`` row too. What each choice was made on:
    ``selection``."""
    out: dict[str, Any] = {"selection": dict(SELECTION)}
    val = _pick(history, f"{VALIDATION}{key}-mean")
    at = val if val is not None else _pick(history, f"{key}-mean")
    assert at is not None  # every row has <key>-mean
    row = history[at]
    if val is None:
        del out["selection"]["val_selected"]
    else:
        out |= {"val_selected_round": int(row["round"]), "val_selected_accuracy": float(row[f"{key}-mean"]),
                "val_selected_accuracy_weighted": float(row.get(key, math.nan)),
                "val_selected_val_accuracy": float(row[f"{VALIDATION}{key}-mean"])}
    for prefix, where in (("", row), ("final_", history[final])):
        for name in ("bottom10", "p10"):
            if f"{key}-{name}" in where:
                out[f"{prefix}{name}_{key}"] = float(where[f"{key}-{name}"])
    if f"{UNSEEN}{key}-mean" in row:
        unseen = float(row[f"{UNSEEN}{key}-mean"])
        out |= {f"unseen_{key}": unseen, f"unseen_{key}_weighted": float(row.get(f"{UNSEEN}{key}", math.nan)),
                "participation_gap": float(row[f"{key}-mean"]) - unseen,
                "unseen_clients": int(row.get(f"{UNSEEN}clients-evaluated", 0))}
    return out


def rounds_to_target(history: Sequence[Mapping[str, Any]], target: float, key: str = "accuracy") -> dict[str, Any]:
    """``rounds_to_target``: the first evaluated round whose validation mean (``val-<key>-mean``; without a
    validation part, the test ``<key>-mean``) reaches ``target``, ``None`` when none did; and what it was read
    on (``rounds_to_target_on``). Nothing for ``target`` 0 (off)."""
    if target <= 0:
        return {}
    on, column = ("validation", f"{VALIDATION}{key}-mean") if all(f"{VALIDATION}{key}-mean" in h for h in history) \
        else ("test", f"{key}-mean")
    reached = [int(h["round"]) for h in history if float(h[column]) >= target]
    return {"rounds_to_target": min(reached) if reached else None, "rounds_to_target_on": on, "target_accuracy": target}
