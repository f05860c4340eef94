"""Metric aggregation for Flower's hooks, for our strategies and Flower's alike."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence
from logging import WARNING
from typing import Any

from flwr.app import MetricRecord, RecordDict
from flwr.common.logger import log

from flower_pfl.engine.client_metrics import (
    GLOBAL_ACCURACY,
    VAL_NUM_EXAMPLES,
    VALIDATION,
    new_client_metrics,
    round_metrics,
    validation_means,
    weighted_means,
)
from flower_pfl.engine.reply_checks import (
    MAX_WEIGHT_RATIO,
    RoundReplies,
    UpdateRejected,
    cap_weights,
    check_evaluation,
    is_finite_number,
)
from flower_pfl.run.cost import NOT_WEIGHTED, reply_cost
from strategies.records import merged

ACCURACY, LOSS, NUM_EXAMPLES = "accuracy", "loss", "num-examples"
#: evaluation metrics that name rather than measure (a node's partition, a CRC of its model): never averaged
IDENTITIES = ("partition-id", "model-fingerprint")


def checked_evaluations(rows: Iterable[tuple[Hashable, Mapping[str, Any]]], accuracy_key: str = ACCURACY,
                        max_weight_ratio: float = MAX_WEIGHT_RATIO) -> tuple[list[tuple[Hashable, dict[str, Any]]], list[tuple[Hashable, str]]]:
    """The usable evaluation replies of ``(client, metrics)`` rows as ``(client, metrics)``
    (``check_evaluation``; sample counts capped at ``max_weight_ratio`` × their median) and
    ``(client, reason)`` for the others."""
    good: list[tuple[Hashable, dict[str, Any]]] = []
    refused: list[tuple[Hashable, str]] = []
    for cid, metrics in rows:
        try:
            good.append((cid, check_evaluation(metrics, accuracy_key, fractions=(GLOBAL_ACCURACY, VALIDATION + accuracy_key))))
        except UpdateRejected as err:
            refused.append((cid, str(err)))
    for (_, row), n in zip(good, cap_weights([int(r[NUM_EXAMPLES]) for _, r in good], max_weight_ratio)):
        row[NUM_EXAMPLES] = n
    return good, refused


def checked_groups(is_new: Callable[[Hashable], bool], rows: Iterable[tuple[Hashable, Mapping[str, Any]]], accuracy_key: str,
                   max_weight_ratio: float) -> tuple[list[tuple[Hashable, dict[str, Any]]], list[tuple[Hashable, dict[str, Any]]],
                                                     list[tuple[Hashable, str]]]:
    """``checked_evaluations`` of the participating clients' rows and, apart, of the clients that never train
    (``is_new``: the server knows which are which, whatever a reply says), each group's sample counts capped
    by its own median; returns both groups' usable rows and every refusal."""
    rows = list(rows)
    kept, refused = checked_evaluations([r for r in rows if not is_new(r[0])], accuracy_key, max_weight_ratio)
    new, refused_new = checked_evaluations([r for r in rows if is_new(r[0])], accuracy_key, max_weight_ratio)
    return kept, new, refused + refused_new


def log_refused_evaluations(server_round: int | None, refused: list[tuple[Hashable, str]]) -> None:
    for cid, reason in refused:
        log(WARNING, "round %s: evaluation of client %s left out (%s)", server_round, cid, reason)


class PersonalizedMetrics:
    """Every strategy's default evaluation aggregation: ``flower_pfl.engine.client_metrics.round_metrics``, i.e.
    every numeric metric the clients report, sample-weighted under its own name exactly as Flower's
    FedAvg reports it, plus the personalized view of ``accuracy_key`` over clients
    (``<key>-mean``, ``-std``, ``-min``, ``clients-evaluated``) and ``<key>-bmta``, the best
    ``<key>-mean`` so far (BMTA). ``global-accuracy`` (a method's global model, pFedMe's GM) gets the
    same spread; ``identities`` (a node's ``partition-id``, ``model-fingerprint``) are not averaged.
    Clients that lack ``accuracy_key`` still count for the other metrics; when none reports it, one
    warning names the metrics they do report.

    Message API: ``evaluate_metrics_aggr_fn=PersonalizedMetrics("eval-acc")``; legacy API:
    ``evaluate_metrics_aggregation_fn=PersonalizedMetrics("eval-acc").legacy``.
    """

    def __init__(self, accuracy_key: str = ACCURACY, identities: Collection[str] = IDENTITIES) -> None:
        self.accuracy_key = accuracy_key
        self.identities = tuple(identities)
        #: the best ``<key>-mean`` so far (restored from a resumed run's history)
        self.best = -math.inf
        self._warned = False

    def __repr__(self) -> str:
        return f"PersonalizedMetrics({self.accuracy_key!r})"

    def aggregate(self, rows: Sequence[Mapping[str, Any]], weights: Sequence[float], weight_key: str = NUM_EXAMPLES) -> dict[str, Any]:
        """``round_metrics`` of the rows (``weight_key`` left out) and the running BMTA."""
        key = self.accuracy_key
        also = (VALIDATION + key,) + (() if key == GLOBAL_ACCURACY else (GLOBAL_ACCURACY,))
        out = round_metrics(rows, weights, key, also=also,
                            skip=(weight_key, VAL_NUM_EXAMPLES, *self.identities, *NOT_WEIGHTED)) | reply_cost(rows)
        out.update(validation_means(rows))  # the validation figures weighed by the validation parts
        mean = out.get(f"{key}-mean")
        if mean is not None:
            self.best = max(self.best, mean)
            out[f"{key}-bmta"] = self.best
        elif rows and not self._warned:
            self._warned = True
            seen = sorted({k for r in rows for k in r} - {weight_key, *self.identities})
            log(WARNING, "no client reports '%s' in its evaluation (they report %s): the personalized summary "
                "needs accuracy_key=<the clients' accuracy metric>", key, ", ".join(seen) or "nothing")
        return out

    def new_clients(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """The figures of the clients that never train (``new_client_metrics``, weighted by ``num-examples``; none
        without such rows)."""
        return new_client_metrics(rows, [float(r[NUM_EXAMPLES]) for r in rows], self.accuracy_key) if rows else {}

    def __call__(self, records: list[RecordDict], weighted_by_key: str = NUM_EXAMPLES) -> MetricRecord:
        """Message API (``evaluate_metrics_aggr_fn``)."""
        rows: list[dict[str, Any]] = [merged(rd, MetricRecord) for rd in records]
        rows = [r for r in rows if is_finite_number(r.get(weighted_by_key)) and r[weighted_by_key] > 0]
        return MetricRecord(self.aggregate(rows, [float(r[weighted_by_key]) for r in rows], weighted_by_key))

    def legacy(self, results: Sequence[tuple[float, Mapping[str, Any]]]) -> dict[str, Any]:
        """Legacy API (``evaluate_metrics_aggregation_fn``): ``(num_examples, metrics)`` pairs."""
        results = [(n, m) for n, m in results if is_finite_number(n) and n > 0]
        return self.aggregate([m for _, m in results], [float(n) for n, _ in results])


def weighted_train_metrics(results: list[tuple[int, Mapping[str, object]]], weight_key: str = NUM_EXAMPLES) -> dict[str, Any]:
    """Flower's FedAvg training metrics: every numeric metric's sample-weighted mean under its own
    name (``flower_pfl.engine.client_metrics.weighted_means``; non-numeric or non-finite values are left out),
    but the clients' training time and peak memory: their plain mean and their largest (``reply_cost``)."""
    rows = [m for _, m in results]
    return weighted_means(rows, [float(n) for n, _ in results], skip=(weight_key, *IDENTITIES, *NOT_WEIGHTED)) | reply_cost(rows)


def reply_counts(batch: RoundReplies) -> dict[str, float]:
    """How many clients of a round were accepted, rejected and failed, and how close the closest
    accepted reply came to the update bounds (``update-bound-use``: 1 = at the bound, see ``ReplyBounds``)."""
    return {"clients-accepted": len(batch.accepted), "clients-rejected": batch.rejected, "clients-failed": batch.failed,
            "update-bound-use": batch.bound_use}


def round_replies_metrics(batch: RoundReplies, weight_key: str = NUM_EXAMPLES) -> dict[str, Any]:
    """A training round's metrics: the sample-weighted mean of the accepted clients' numeric metrics
    and the round's ``reply_counts``."""
    return {**weighted_train_metrics([(r.num_examples, r.metrics) for r in batch.accepted], weight_key), **reply_counts(batch)}
