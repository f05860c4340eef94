"""Metric aggregation for Flower's hooks, for our strategies and Flower's alike."""

from __future__ import annotations

from typing import Iterable, Mapping

from flwr.app import MetricRecord, RecordDict

from flower_pfl.metrics import GLOBAL_ACCURACY, round_metrics
from flower_pfl.server_step import RoundReplies

ACCURACY, LOSS, NUM_EXAMPLES = "accuracy", "loss", "num-examples"


def _from_metrics(metrics: Iterable[Mapping[str, float]]) -> dict[str, float]:
    rows = list(metrics)
    sizes = [int(m[NUM_EXAMPLES]) for m in rows]
    out = round_metrics(
        [float(m[ACCURACY]) for m in rows], sizes,
        [float(m[LOSS]) for m in rows] if all(LOSS in m for m in rows) else None,
    )
    if rows and all(GLOBAL_ACCURACY in m for m in rows):
        glob = round_metrics([float(m[GLOBAL_ACCURACY]) for m in rows], sizes)
        out.update({"global_accuracy": glob["accuracy"], "global_accuracy_weighted": glob["accuracy_weighted"]})
    return out


def personalized_evaluate_metrics(records: list[RecordDict], weighted_by_key: str = NUM_EXAMPLES) -> MetricRecord:
    """Message-API ``evaluate_metrics_aggr_fn``: mean, weighted mean and std of client accuracies."""
    metrics = [next(iter(rd.metric_records.values())) for rd in records]
    return MetricRecord(_from_metrics(metrics))


def personalized_evaluate_metrics_legacy(results: list[tuple[int, Mapping[str, float]]]) -> dict[str, float]:
    """Legacy ``evaluate_metrics_aggregation_fn`` with the same output."""
    return _from_metrics({**m, NUM_EXAMPLES: n} for n, m in results)


def _numeric(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def weighted_train_metrics(results: list[tuple[int, Mapping[str, object]]]) -> dict[str, float]:
    """Sample-weighted mean of every numeric training metric all clients report (others are skipped)."""
    total = sum(n for n, _ in results)
    if not results or total <= 0:
        return {}
    keys = {k for k in set.intersection(*(set(m) for _, m in results)) - {NUM_EXAMPLES}
            if all(_numeric(m[k]) for _, m in results)}
    return {k: float(sum(n * float(m[k]) for n, m in results) / total) for k in sorted(keys)}  # type: ignore[arg-type]


def round_replies_metrics(batch: RoundReplies) -> dict[str, float]:
    """A training round's metrics: the sample-weighted mean of the accepted clients' numeric metrics,
    and how many clients were accepted, rejected and failed."""
    out = weighted_train_metrics([(r.num_examples, r.metrics) for r in batch.accepted])
    out.update({"clients-accepted": len(batch.accepted), "clients-rejected": batch.rejected, "clients-failed": batch.failed})
    return out
