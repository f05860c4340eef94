"""What the server refuses: the checks every client reply passes before a method sees it.

Each reply is checked on its own (``check_update``, ``check_num_examples``, the method's
``check_extras``; ``check_evaluation`` for evaluation replies), then against the round's other
replies (``ReplyBounds``): an update whose change is far larger than both what its client was sent
and the round's median change is refused, and no sample count weighs more than a multiple of the
round's median. These are sanity bounds against broken or careless clients, not Byzantine-robust
aggregation: clients that collude, or changes within the bounds, still reach the method.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from flower_pfl.engine.client_metrics import is_finite_number, is_number, numbers
from flower_pfl.engine.deprecated import renamed
from flower_pfl.engine.layout import ParamLayout
from flower_pfl.engine.wire import decode_flat

ClientId = Hashable

#: the default of ``ReplyBounds.max_update_ratio`` (run config ``max-update-ratio``)
MAX_UPDATE_RATIO = 10.0
#: the default of ``ReplyBounds.max_median_ratio`` (run config ``max-median-ratio``)
MAX_MEDIAN_RATIO = 100.0
#: the default of ``ReplyBounds.max_weight_ratio`` (run config ``max-weight-ratio``)
MAX_WEIGHT_RATIO = 1000.0


#: the largest integer every smaller one of which float32 holds exactly (integer arrays are taken up to it)
EXACT_INTEGERS = 2**24


class UpdateRejected(ValueError):
    """A client reply that cannot be used; the message says why (naming the field)."""


class AlgorithmOutputMissing(UpdateRejected):
    """One reply refused because it lacks what the method's client algorithm returns (``algorithm``,
    e.g. ``ScaffoldCorrection``): its client does not run that algorithm."""

    def __init__(self, message: str, algorithm: str) -> None:
        super().__init__(message)
        self.algorithm = algorithm


class ClientAlgorithmNotRun(RuntimeError):
    """Fatal: no client of a round runs the method's client algorithm, without which the method cannot
    work (the message says how to fix it)."""


__getattr__ = renamed(__name__, {"ClientStepNotRun": (__name__, "ClientAlgorithmNotRun"),
                                 "StepOutputMissing": (__name__, "AlgorithmOutputMissing")})


@dataclass
class RawReply:
    """A client's training reply as the Flower layer found it, before any check."""

    client_id: ClientId
    arrays: Sequence[np.ndarray]
    names: Sequence[str] | None
    num_examples: Any
    metrics: Mapping[str, Any]
    extras: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Reply:
    """One client's accepted training reply: its flat model, sample count, metrics, checked extras
    and the receipt of the client algorithm it ran (``ClientAlgorithm.finish``; ``None``: none)."""

    client_id: ClientId
    model: torch.Tensor
    num_examples: int
    metrics: Mapping[str, Any]
    extras: Any = None
    receipt: str | None = None


@dataclass
class RoundReplies:
    """A round's accepted replies and what happened to the others."""

    accepted: list[Reply] = field(default_factory=list)
    failed: int = 0
    #: ``(client, reason)`` of every refused reply, in the order they were refused
    rejections: list[tuple[ClientId, str]] = field(default_factory=list)
    #: the client algorithm replies showed missing (``AlgorithmOutputMissing``), and how many
    missing_algorithm: str | None = None
    missing_algorithm_count: int = 0
    #: the largest accepted change as a fraction of its bound (``ReplyBounds``; 1: at the bound); 0 if none
    bound_use: float = 0.0

    @property
    def rejected(self) -> int:
        return len(self.rejections)

    def reject(self, client_id: ClientId, reason: str) -> None:
        self.rejections.append((client_id, reason))


def check_num_examples(value: Any, name: str = "num-examples") -> int:
    """A sample count: a finite number >= 1 (rounded down), else ``UpdateRejected``."""
    if not is_finite_number(value) or value < 1:
        raise UpdateRejected(f"'{name}' = {_show(value)} is not a finite number >= 1")
    return int(value)


def received_vector(extras: Mapping[str, Any], key: str, size: int, what: str, algorithm: str) -> torch.Tensor:
    """The float32 vector of ``size`` values a reply's extras carry under ``key`` (``what``: what it holds):
    ``AlgorithmOutputMissing`` naming the client ``algorithm`` when absent, ``ValueError`` for another
    size or a value that is not finite. A method checks its own further conditions on the result."""
    if key not in extras:
        raise AlgorithmOutputMissing(f"the reply lacks '{key}' ({what})", algorithm)
    vector = decode_flat(extras[key], size, key)
    if not torch.isfinite(vector).all():
        raise ValueError(f"'{key}' holds NaN or Inf")
    return vector


def check_update(layout: ParamLayout, arrays: Sequence[np.ndarray], names: Sequence[str] | None = None) -> torch.Tensor:
    """Returned arrays as a flat vector, or ``UpdateRejected`` with the reason.

    Rejected: other parameter names or count, other shapes, a dtype other than float32 (or
    integers that float32 holds exactly, such as a batch-norm layer's batch counter), NaN or Inf
    anywhere. ``names=None`` (the legacy API sends none): the layout's order.
    """
    if names is not None and tuple(names) != layout.names:
        raise UpdateRejected(f"the arrays' names {list(names)} differ from the model's {list(layout.names)}")
    if len(arrays) != len(layout.shapes):
        raise UpdateRejected(f"expected {len(layout.shapes)} arrays, got {len(arrays)}")
    checked = []
    for name, arr, shape in zip(layout.names, arrays, layout.shapes):
        if not isinstance(arr, np.ndarray):
            raise UpdateRejected(f"'{name}' is a {type(arr).__name__}, not an array")
        if tuple(arr.shape) != shape:
            raise UpdateRejected(f"'{name}' has shape {tuple(arr.shape)}, expected {shape}")
        if arr.dtype.kind in "iu" and (arr.size == 0 or int(np.abs(arr).max()) <= EXACT_INTEGERS):
            arr = arr.astype(np.float32)
        elif arr.dtype != np.float32:
            raise UpdateRejected(f"'{name}' has dtype {arr.dtype}, expected float32")
        if not np.isfinite(arr).all():
            raise UpdateRejected(f"'{name}' contains NaN or Inf")
        checked.append(arr)
    return layout.flatten(checked)


def secure_aggregate_arrays(arrays: Sequence[Any]) -> list[Any]:
    """The replies' mean that secure aggregation hands the server (SecAgg+ dequantizes its sum in float64)
    in float32, the dtype ``check_update`` asks of a reply: float64 arrays are narrowed (a value beyond
    float32's range becomes Inf, which the check refuses); anything else is left to the check."""
    return [a.astype(np.float32) if isinstance(a, np.ndarray) and a.dtype == np.float64 else a for a in arrays]


def decoded(what: str, convert: Callable[[], Any]) -> Any:
    """``convert()``, with any error it raises (bytes that are not what they claim) as ``UpdateRejected``."""
    try:
        return convert()
    except Exception as err:
        raise UpdateRejected(f"{what} cannot be decoded ({type(err).__name__}: {err})") from err


def check_evaluation(metrics: Mapping[str, Any], accuracy_key: str = "accuracy",
                     fractions: Sequence[str] = ()) -> dict[str, Any]:
    """An evaluation reply's numeric metrics, or ``UpdateRejected``.

    ``num-examples`` must be a finite number >= 1, and ``accuracy_key`` (and every key in
    ``fractions``), where present, a finite number in [0, 1]: a client claiming 7.0 is left out
    rather than averaged. Other metrics are kept when they are finite numbers (or lists of them) and
    dropped otherwise (a diverged client's NaN loss does not hide its accuracy). A reply without
    ``accuracy_key`` is kept for its other metrics.
    """
    for key in (accuracy_key, *fractions):
        if key in metrics and not (is_finite_number(metrics[key]) and 0 <= metrics[key] <= 1):
            raise UpdateRejected(f"'{key}' = {_show(metrics[key])} is not a number in [0, 1]")
    if "num-examples" not in metrics:
        raise UpdateRejected("the evaluation reply lacks 'num-examples'")
    out = {k: [float(x) for x in v] if isinstance(v, (list, tuple)) else float(v) for k, v in metrics.items() if numbers(v) is not None}
    out["num-examples"] = check_num_examples(metrics["num-examples"])
    return out


@dataclass(frozen=True)
class ReplyBounds:
    """Sanity bounds on a round's replies (on by default; ``math.inf`` turns one off).

    ``max_update_ratio``: reply i is refused when its model's change ``‖x_i − x_sent,i‖₂``
    (``ServerAlgorithm.update_norms``) exceeds this multiple of ``‖x_sent,i‖₂``, the norm of the model it
    was sent. Honest local training changes a model by a fraction of its norm (at most 0.43 on the
    Synthetic benchmark, ``benchmarks/update_ratios.py``).

    ``max_median_ratio``: what has no such reference (SCAFFOLD's ``Δc_i``, FedAttn's ``Z_i`` and
    bias gradient, a model sent as all zeros) is refused above this multiple of the round's
    lower-median value of the same field (honest clients reach about 5 on the benchmark).

    ``max_weight_ratio``: a reply's ``num-examples`` counts at most this multiple of the lower-median
    count (and at least 1): of the round's replies, or, with a ``WeightBook``, of the first claims of
    every client the federation has shown. The default 1000 leaves the heavy-tailed Synthetic data
    (up to ~850× between clients) untouched.
    """

    max_update_ratio: float = MAX_UPDATE_RATIO
    max_weight_ratio: float = MAX_WEIGHT_RATIO
    max_median_ratio: float = MAX_MEDIAN_RATIO

    def __post_init__(self) -> None:
        for name in ("max_update_ratio", "max_weight_ratio", "max_median_ratio"):
            value = getattr(self, name)
            if not is_number(value) or not value >= 1:
                raise ValueError(f"{name} must be a number >= 1 (math.inf: off), got {value!r}")

    def apply(self, replies: Sequence[Reply], norms: Sequence[Mapping[str, tuple[float, float]]],
              batch: RoundReplies, book: WeightBook | None = None) -> list[Reply]:
        """The replies within the update bound, their counts capped (by ``book`` when given, else
        against the round's median); ``norms[i]`` maps each field reply i changed to ``(norm of the
        change, norm of its reference)``. Refusals go to ``batch``."""
        medians = {f: lower_median([n[f][0] for n in norms if f in n]) for f in {f for n in norms for f in n}}
        kept = []
        for reply, changed in zip(replies, norms):
            use = {f: _ratio(change, ref or medians[f]) / (self.max_update_ratio if ref else self.max_median_ratio)
                   for f, (change, ref) in changed.items()}
            too_far = [f for f, u in use.items() if not u <= 1]
            if too_far:
                f = too_far[0]
                change, ref = changed[f]
                against = (f"max-update-ratio = {self.max_update_ratio:g} times the norm of the model it was sent, {ref:.3g}" if ref
                           else f"max-median-ratio = {self.max_median_ratio:g} times the round's median, {medians[f]:.3g}")
                what = "changed by a norm of" if f == "model" else "has a norm of"
                batch.reject(reply.client_id, f"'{f}' {what} {change:.3g}, more than {against}")
                continue
            batch.bound_use = max(batch.bound_use, *use.values(), 0.0)
            kept.append(reply)
        claims = [r.num_examples for r in kept]
        counts = book.count([r.client_id for r in kept], claims) if book is not None else cap_weights(claims, self.max_weight_ratio)
        return [r if r.num_examples == n else replace(r, num_examples=n) for r, n in zip(kept, counts)]


def _ratio(change: float, reference: float) -> float:
    if change == 0:
        return 0.0
    return change / reference if reference > 0 else math.inf  # inf / 0.1 stays inf: refused


def cap_weights(counts: Sequence[int], ratio: float) -> list[int]:
    """Sample counts capped at ``ratio`` × their lower median."""
    if not counts or math.isinf(ratio):
        return list(counts)
    cap = max(1, int(ratio * lower_median(counts)))
    return [min(n, cap) for n in counts]


class WeightBook:
    """What a client's ``num-examples`` may count for, from what the federation has claimed so far.

    A client's count never exceeds the first count it was given (honest clients keep their data: a
    claim that grows is a broken or lying client), nor ``ratio`` × the lower median of the first
    claims of every client seen so far, this round's newcomers included (one small round, or a few
    colluding clients in it, cannot raise that median). The first claims and hence every count of an
    honest federation are left as claimed while its sizes differ by less than ``ratio`` × its median.
    No bound on sizes alone tells an honest client with 850× the data of the others from a lying one
    the first time it is seen: the book bounds what a claim can grow to, not whether it is true.
    """

    def __init__(self, ratio: float = MAX_WEIGHT_RATIO) -> None:
        self.ratio = ratio
        #: each client's first counted ``num-examples``, in order of first appearance
        self.first: dict[ClientId, int] = {}

    def count(self, ids: Sequence[ClientId], claims: Sequence[int]) -> list[int]:
        """The counts of a round's replies (``claims`` by client ``ids``), taking in the newcomers' claims."""
        if math.isinf(self.ratio):
            return list(claims)
        newcomers = {cid: n for cid, n in zip(ids, claims) if cid not in self.first}
        cap = max(1, int(self.ratio * lower_median([*self.first.values(), *newcomers.values()])))
        for cid, n in newcomers.items():
            self.first[cid] = min(n, cap)
        return [min(n, self.first[cid], cap) for cid, n in zip(ids, claims)]

    def get_state(self) -> dict[str, Any]:
        return {"first": dict(self.first)}

    def set_state(self, state: Mapping[str, Any]) -> None:
        self.first = {cid: int(n) for cid, n in state["first"].items()}


def model_change(reply: Reply, sent: torch.Tensor) -> dict[str, tuple[float, float]]:
    """The model's change against what was sent, and the norm of what was sent (``ReplyBounds``' default)."""
    return {"model": (norm(reply.model - sent), norm(sent))}


def norm(vector: torch.Tensor) -> float:
    """The Euclidean norm, in float64 (float32 squares of 1e20 already overflow)."""
    return float(torch.linalg.vector_norm(vector, dtype=torch.float64))


def screen(raws: Sequence[RawReply], sent: Mapping[ClientId, torch.Tensor], check: Callable[[RawReply], Reply],
           norms: Callable[[Reply, torch.Tensor], Mapping[str, tuple[float, float]]], bounds: ReplyBounds,
           batch: RoundReplies, book: WeightBook | None = None) -> None:
    """Put a round's usable training replies into ``batch.accepted`` and the reasons for the others into
    ``batch.rejections``: each reply must answer an instruction (``sent``: what each client was sent),
    once, and pass ``check``; then ``bounds`` apply to what ``norms`` says each changed, and ``book``
    (when given) to the sample counts."""
    checked: list[Reply] = []
    seen: set[ClientId] = set()
    for raw in raws:
        try:
            if raw.client_id not in sent:
                raise UpdateRejected("it was not asked to train this round")
            if raw.client_id in seen:
                raise UpdateRejected("a second reply in one round")
            seen.add(raw.client_id)
            checked.append(check(raw))
        except AlgorithmOutputMissing as err:
            batch.missing_algorithm, batch.missing_algorithm_count = err.algorithm, batch.missing_algorithm_count + 1
            batch.reject(raw.client_id, str(err))
        except UpdateRejected as err:
            batch.reject(raw.client_id, str(err))
    changes = [norms(r, sent[r.client_id].to(r.model.device)) for r in checked]
    batch.accepted.extend(bounds.apply(checked, changes, batch, book))


def lower_median(values: Sequence[float]) -> float:
    """The median, the lower middle value for an even count (so one outlier of two cannot move it)."""
    return float(sorted(values)[(len(values) - 1) // 2]) if values else 0.0


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
