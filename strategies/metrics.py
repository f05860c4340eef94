"""Metric aggregation for Flower's hooks, for our strategies and Flower's alike."""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping
from logging import WARNING
from typing import Any

from flwr.app import MetricRecord, RecordDict
from flwr.common.logger import log

from flower_pfl.metrics import GLOBAL_ACCURACY, round_metrics
from flower_pfl.reply_checks import (
    MAX_WEIGHT_RATIO,
    RoundReplies,
    UpdateRejected,
    cap_weights,
    check_evaluation,
    is_finite_number,
)

ACCURACY, LOSS, NUM_EXAMPLES = "accuracy", "loss", "num-examples"


def checked_evaluations(rows: Iterable[tuple[Hashable, Mapping[str, Any]]], accuracy_key: str = ACCURACY,
                        max_weight_ratio: float = MAX_WEIGHT_RATIO) -> tuple[list[dict[str, float]], list[tuple[Hashable, str]]]:
    """The usable evaluation replies of ``(client, metrics)`` rows (``check_evaluation``; sample
    counts capped at ``max_weight_ratio`` × their median) and ``(client, reason)`` for the others."""
    good: list[dict[str, float]] = []
    refused: list[tuple[Hashable, str]] = []
    for cid, metrics in rows:
        try:
            good.append(check_evaluation(metrics, accuracy_key, fractions=(GLOBAL_ACCURACY,)))
        except UpdateRejected as err:
            refused.append((cid, str(err)))
    for row, n in zip(good, cap_weights([int(r[NUM_EXAMPLES]) for r in good], max_weight_ratio)):
        row[NUM_EXAMPLES] = n
    return good, refused


def log_refused_evaluations(server_round: int | None, refused: list[tuple[Hashable, str]]) -> None:
    for cid, reason in refused:
        log(WARNING, "round %s: evaluation of client %s left out (%s)", server_round, cid, reason)


def _from_metrics(metrics: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    rows, refused = checked_evaluations((None, m) for m in metrics)
    log_refused_evaluations(None, refused)
    if not rows:
        return {}
    sizes = [int(m[NUM_EXAMPLES]) for m in rows]
    out = round_metrics(
        [m[ACCURACY] for m in rows], sizes,
        [m[LOSS] for m in rows] if all(LOSS in m for m in rows) else None,
    )
    if all(GLOBAL_ACCURACY in m for m in rows):
        glob = round_metrics([m[GLOBAL_ACCURACY] for m in rows], sizes)
        out.update({"global_accuracy": glob["accuracy"], "global_accuracy_weighted": glob["accuracy_weighted"]})
    return out


def personalized_evaluate_metrics(records: list[RecordDict], weighted_by_key: str = NUM_EXAMPLES) -> MetricRecord:
    """Message-API ``evaluate_metrics_aggr_fn``: mean, weighted mean and std of client accuracies
    (replies that fail ``check_evaluation`` are left out)."""
    metrics = [next(iter(rd.metric_records.values())) for rd in records if rd.metric_records]
    return MetricRecord(_from_metrics(metrics))


def personalized_evaluate_metrics_legacy(results: list[tuple[int, Mapping[str, Any]]]) -> dict[str, float]:
    """Legacy ``evaluate_metrics_aggregation_fn`` with the same output."""
    return _from_metrics({**m, NUM_EXAMPLES: n} for n, m in results)


def weighted_train_metrics(results: list[tuple[int, Mapping[str, object]]]) -> dict[str, float]:
    """Sample-weighted mean of every metric all clients report as a finite number (others are skipped)."""
    total = sum(n for n, _ in results)
    if not results or total <= 0:
        return {}
    keys = {k for k in set.intersection(*(set(m) for _, m in results)) - {NUM_EXAMPLES}
            if all(is_finite_number(m[k]) for _, m in results)}
    out = {k: float(sum(n * float(m[k]) for n, m in results) / total) for k in sorted(keys)}  # type: ignore[arg-type]
    return {k: v for k, v in out.items() if math.isfinite(v)}


def reply_counts(batch: RoundReplies) -> dict[str, float]:
    """How many clients of a round were accepted, rejected and failed, and how close the closest
    accepted reply came to the update bounds (``update-bound-use``: 1 = at the bound, see ``ReplyBounds``)."""
    return {"clients-accepted": len(batch.accepted), "clients-rejected": batch.rejected, "clients-failed": batch.failed,
            "update-bound-use": batch.bound_use}


def round_replies_metrics(batch: RoundReplies) -> dict[str, float]:
    """A training round's metrics: the sample-weighted mean of the accepted clients' numeric metrics
    and the round's ``reply_counts``."""
    return {**weighted_train_metrics([(r.num_examples, r.metrics) for r in batch.accepted]), **reply_counts(batch)}
