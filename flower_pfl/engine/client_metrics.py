"""The clients' metrics of a round, combined: sample-weighted means under the clients' own names
(Flower's aggregation) and the personalized view over clients (mean, spread, minimum).

Per evaluated round every client reports its accuracy of the model it would use, on its own
test split; ``round_metrics`` turns those into the round's row (``flower_pfl.run.summary``
makes a run's figures from the rows).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any, TypeGuard

import numpy as np


def weighted_means(rows: Sequence[Mapping[str, Any]], weights: Sequence[float], skip: Collection[str] = ()) -> dict[str, Any]:
    """Every numeric metric's weighted mean, under its own name: Flower's FedAvg aggregation
    (``aggregate_metricrecords``: ``Σ_i w_i m_i / Σ_i w_i``; lists element-wise). A metric is averaged
    over the rows that report it as finite number(s) of one shape, so a client that lacks a metric or
    reports NaN, a string or a list of another length leaves that metric alone; where every row reports
    every metric the result is Flower's exactly. Keys in ``skip`` (the weight itself) are left out."""
    sums: dict[str, tuple[Any, float]] = {}
    bad: set[str] = set()
    for row, w in zip(rows, weights, strict=True):
        for key, value in row.items():
            if key in skip or key in bad:
                continue
            vec = numbers(value)
            if vec is None:
                continue
            if key in sums:
                total, weight = sums[key]
                if type(total) is float and type(vec) is float:  # most metrics: Python's arithmetic, which warns of nothing
                    sums[key] = (total + w * vec, weight + w)
                    continue
                if np.shape(total) != np.shape(vec):
                    bad.add(key)
                    continue
                with np.errstate(over="ignore", invalid="ignore"):
                    sums[key] = (total + w * vec, weight + w)
            else:
                sums[key] = (w * vec, float(w))
    out: dict[str, Any] = {}
    for key in sorted(set(sums) - bad):
        total, weight = sums[key]
        with np.errstate(over="ignore", invalid="ignore"):
            mean = total / weight if weight > 0 else math.nan
        if np.isfinite(mean).all():  # a sum that overflowed is left out, not reported as inf
            out[key] = mean.tolist() if isinstance(mean, np.ndarray) else float(mean)
    return out


def is_number(value: Any) -> TypeGuard[float]:
    """A real number (Python or numpy, not a bool)."""
    if type(value) in _PLAIN_NUMBERS:  # most values: checked first
        return True
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


_PLAIN_NUMBERS = frozenset({int, float})


def is_finite_number(value: Any) -> TypeGuard[float]:
    return is_number(value) and math.isfinite(value)


def numbers(value: Any) -> Any:
    """A finite number as float, a non-empty list of finite numbers as a float64 array, else None."""
    if is_number(value):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        arr = np.asarray(value, dtype=np.float64)
        return arr if np.isfinite(arr).all() else None
    return None


#: fairness over clients (pFL-Bench's): the mean of the worst tenth of the clients, and the 10th percentile
BOTTOM_SHARE, PERCENTILE = 0.1, 10.0


def spread(values: Sequence[float], key: str) -> dict[str, float]:
    """The personalized view of one metric over clients (the papers' personalized evaluation):
    ``<key>-mean`` (unweighted, the papers' "mean test accuracy"), ``<key>-std`` (population std),
    ``<key>-min``, and its fairness: ``<key>-bottom10``, the mean of the ``ceil(0.1 · n)`` lowest values (at
    least one client; pFL-Bench's bottom decile), and ``<key>-p10``, their 10th percentile (linear
    interpolation, numpy's default)."""
    arr = np.asarray(values, dtype=np.float64)  # in the clients' order: the sums of earlier versions, to the bit
    if arr.size == 0:
        raise ValueError(f"no client value of '{key}'")
    worst = max(1, -(-arr.size // round(1 / BOTTOM_SHARE)))  # ceil(n / 10) in integers
    return {f"{key}-mean": float(arr.mean()), f"{key}-std": float(arr.std()), f"{key}-min": float(arr.min()),
            f"{key}-bottom10": float(np.sort(arr)[:worst].mean()), f"{key}-p10": float(np.percentile(arr, PERCENTILE))}


def round_metrics(rows: Sequence[Mapping[str, Any]], weights: Sequence[float], accuracy_key: str = "accuracy",
                  also: Sequence[str] = (), skip: Collection[str] = ("num-examples",)) -> dict[str, Any]:
    """One evaluated round: ``weighted_means`` of every metric under the clients' own names (so
    ``<accuracy_key>`` is the sample-weighted mean, as Flower reports it), ``spread`` of
    ``accuracy_key`` and of each key in ``also`` over the clients that report it, and
    ``clients-evaluated`` (clients with a finite ``accuracy_key``). ``skip``: the weight's own key and
    metrics that name rather than measure."""
    out = weighted_means(rows, weights, skip=skip)
    for key in (accuracy_key, *also):
        values = [value for r in rows if isinstance(value := numbers(r.get(key)), float)]  # finite, one number
        if values:
            out.update(spread(values, key))
        if key == accuracy_key:
            out[CLIENTS_EVALUATED] = float(len(values))
    return out


#: how many clients' ``accuracy_key`` entered a round's ``<key>-mean``
CLIENTS_EVALUATED = "clients-evaluated"

#: a client's metrics on its validation part (``val-fraction``) carry this prefix; ``val-num-examples`` weighs them
VALIDATION = "val-"
VAL_NUM_EXAMPLES = "val-num-examples"
#: a round's figures of the clients that never train carry this prefix (``unseen-accuracy-mean``, ...)
UNSEEN = "unseen-"
#: the key that marks the evaluation row (``clients.jsonl``) of a client that never trains
NEW_CLIENT_ROW = "new-client"


def validation_means(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The validation metrics (``val-*``) sample-weighted by the validation parts' sizes (``val-num-examples``),
    over the rows that have one: Flower's weighting, with the samples each figure was measured on."""
    have = [r for r in rows if numbers(r.get(VAL_NUM_EXAMPLES)) is not None and float(r[VAL_NUM_EXAMPLES]) > 0]
    keys = {k for r in have for k in r if k.startswith(VALIDATION) and k != VAL_NUM_EXAMPLES}
    return weighted_means([{k: v for k, v in r.items() if k in keys} for r in have], [float(r[VAL_NUM_EXAMPLES]) for r in have])


def new_client_metrics(rows: Sequence[Mapping[str, Any]], weights: Sequence[float], accuracy_key: str = "accuracy") -> dict[str, Any]:
    """The figures of the clients that never train, apart from the participating clients': their sample-weighted
    ``accuracy_key`` and loss and its spread over them, each under ``UNSEEN``, and ``unseen-clients-evaluated``."""
    kept = {accuracy_key, "loss"}
    out = round_metrics([{k: v for k, v in r.items() if k in kept} for r in rows], weights, accuracy_key)
    return {f"{UNSEEN}{key}": value for key, value in out.items()}


#: a client's accuracy of the global model, reported beside its personalized one (pFedMe's GM)
GLOBAL_ACCURACY = "global-accuracy"
