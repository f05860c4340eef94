"""Plumbing shared by every personalized method and by both Flower APIs.

``PersonalizedServer`` keeps one model per client (keyed by the Flower node id),
samples a round's participants with its own seeded generator, asks the method's
rule for the models to send, and checks every returned update before it touches
the store. The legacy and Message-API strategy classes only translate between
Flower's types and this class.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from logging import WARNING
from typing import Any, Callable, Hashable, Iterable, Mapping, Sequence

import numpy as np
import torch
from flwr.common.logger import log

from flower_pfl.diagnostics import AttentionAccumulator
from flower_pfl.layout import ParamLayout
from flower_pfl.methods import ServerRule
from flower_pfl.methods.base import ANCHOR, ANCHOR_KEEP, ANCHOR_SET
from flower_pfl.store import ClientModelStore

from .metrics import weighted_train_metrics


@dataclass
class TrainReplies:
    """A round's accepted updates (ids, flat vectors, (num-examples, metrics), payloads) and
    what happened to the others."""

    ids: list[Hashable] = field(default_factory=list)
    vectors: list[torch.Tensor] = field(default_factory=list)
    metrics: list[tuple[int, Mapping[str, Any]]] = field(default_factory=list)
    #: what ``check_payload`` made of each accepted client's extras (empty when not asked)
    payloads: list[Any] = field(default_factory=list)
    failed: int = 0
    rejected: int = 0

    def metrics_dict(self) -> dict[str, float]:
        out = weighted_train_metrics(self.metrics)
        out.update({"clients-accepted": len(self.ids), "clients-rejected": self.rejected, "clients-failed": self.failed})
        return out


@dataclass(frozen=True)
class Instruction:
    """One client's training instruction: the model to start from and its solver settings."""

    client_id: Hashable
    model: torch.Tensor
    config: dict[str, float | int | str]


class UpdateRejected(ValueError):
    """A client update that cannot be stored; the message says why."""


class PersonalizedServer:
    """Per-client models and the method's rule, independent of the Flower API."""

    def __init__(self, rule: ServerRule, clients_per_round: int, seed: int = 0, device: str | torch.device = "cpu") -> None:
        if clients_per_round < 1:
            raise ValueError(f"clients_per_round must be >= 1, got {clients_per_round}")
        self.rule = rule
        self.clients_per_round = clients_per_round
        self.device = torch.device(device)
        self._rng = np.random.default_rng(seed)
        self.layout: ParamLayout | None = None
        self.store: ClientModelStore | None = None
        #: client-level attention weights, averaged over the rounds each pair met in
        self.attention = AttentionAccumulator()
        #: optional rank of each client for sampling (e.g. its partition id); Flower's
        #: node ids are random per run, so ranking by something stable makes runs repeatable
        self.node_rank: dict[Hashable, int] = {}
        #: the clients sampled in the last round (their order is the rule's row order)
        self.last_participants: list[Hashable] = []

    @property
    def initialized(self) -> bool:
        return self.store is not None

    def initialize(self, arrays: Mapping[str, np.ndarray | torch.Tensor]) -> None:
        """Set the layout and every client's starting model (only the first call counts)."""
        if self.store is None:
            self.layout = ParamLayout.from_arrays(arrays)
            self.store = ClientModelStore(self.layout.flatten(arrays.values()), device=self.device)

    def _require(self) -> tuple[ParamLayout, ClientModelStore]:
        if self.layout is None or self.store is None:
            raise RuntimeError("initialize() must be called with the initial model first")
        return self.layout, self.store

    def _ordered(self, available: Iterable[Hashable]) -> list[Hashable]:
        return sorted(available, key=lambda cid: (self.node_rank.get(cid, math.inf), cid))

    def sample(self, available: Iterable[Hashable], k: int | None = None) -> list[Hashable]:
        """``k`` (default ``clients_per_round``) distinct clients, uniformly, reproducibly."""
        pool = self._ordered(available)
        k = min(self.clients_per_round if k is None else k, len(pool))
        return [pool[i] for i in sorted(self._rng.choice(len(pool), size=k, replace=False))]

    def sample_fraction(self, available: Iterable[Hashable], fraction: float) -> list[Hashable]:
        """All clients for ``fraction >= 1``, else ``ceil(fraction * n)`` of them."""
        pool = self._ordered(available)
        return pool if fraction >= 1.0 else self.sample(pool, max(1, math.ceil(fraction * len(pool))))

    def models_for_training(self, ids: Sequence[Hashable]) -> torch.Tensor:
        """The ``(m, d)`` models the rule makes for this round's participants."""
        layout, store = self._require()
        models, weights = self.rule.personalize(store.get(ids), layout)
        if weights is not None:
            self.attention.add(ids, weights)
        return models

    def plan_training(self, available: Iterable[Hashable]) -> list[Instruction]:
        """This round's training instructions: the sampled clients get the rule's models;
        with ``rule.all_clients_train`` every other client gets its own stored model to
        continue from, anchored to the model it last received (kept in client state)."""
        pool = self._ordered(available)
        sampled = self.last_participants = self.sample(pool)
        settings = self.rule.client_config()
        models = self.models_for_training(sampled)
        if not self.rule.all_clients_train:
            return [Instruction(cid, models[i], settings) for i, cid in enumerate(sampled)]
        chosen = set(sampled)
        others = [cid for cid in pool if cid not in chosen]
        own = self.stored_models(others)
        return ([Instruction(cid, models[i], {**settings, ANCHOR: ANCHOR_SET}) for i, cid in enumerate(sampled)]
                + [Instruction(cid, own[j], {**settings, ANCHOR: ANCHOR_KEEP}) for j, cid in enumerate(others)])

    def stored_models(self, ids: Sequence[Hashable]) -> torch.Tensor:
        """The clients' current personalized models (what they evaluate)."""
        return self._require()[1].get(ids)

    def to_named_arrays(self, vector: torch.Tensor) -> dict[str, np.ndarray]:
        layout, _ = self._require()
        return dict(zip(layout.names, layout.to_numpy_list(vector)))

    def to_arrays(self, vector: torch.Tensor) -> list[np.ndarray]:
        return self._require()[0].to_numpy_list(vector)

    def check_update(self, arrays: Sequence[np.ndarray], names: Sequence[str] | None = None) -> torch.Tensor:
        """A client's returned arrays as a flat vector, or ``UpdateRejected`` (see ``check_update``)."""
        return check_update(self._require()[0], arrays, names)

    def commit(self, ids: Sequence[Hashable], rows: Sequence[torch.Tensor]) -> None:
        """Store accepted updates."""
        if ids:
            self._require()[1].put(list(ids), torch.stack(list(rows)))


def check_update(layout: ParamLayout, arrays: Sequence[np.ndarray], names: Sequence[str] | None = None) -> torch.Tensor:
    """Returned arrays as a flat vector, or ``UpdateRejected`` with the reason.

    Rejected: other parameter names or count, other shapes, a dtype other than
    float32, NaN or Inf anywhere.
    """
    if names is not None and tuple(names) != layout.names:
        raise UpdateRejected(f"parameter names {list(names)} differ from {list(layout.names)}")
    if len(arrays) != len(layout.shapes):
        raise UpdateRejected(f"expected {len(layout.shapes)} arrays, got {len(arrays)}")
    for name, arr, shape in zip(layout.names, arrays, layout.shapes):
        if tuple(arr.shape) != shape:
            raise UpdateRejected(f"'{name}' has shape {tuple(arr.shape)}, expected {shape}")
        if arr.dtype != np.float32:
            raise UpdateRejected(f"'{name}' has dtype {arr.dtype}, expected float32")
        if not np.isfinite(arr).all():
            raise UpdateRejected(f"'{name}' contains NaN or Inf")
    return layout.flatten(arrays)


def make_rule(rule_class: type | None, rule: ServerRule | None, rule_kwargs: dict[str, Any]) -> ServerRule:
    """The strategy's rule: ``rule`` as given, or ``rule_class(**rule_kwargs)``."""
    if rule is not None:
        if rule_kwargs:
            raise TypeError(f"pass either a rule or its arguments, not both (got {sorted(rule_kwargs)})")
        return rule
    if rule_class is None:
        raise TypeError("this strategy needs a rule")
    return rule_class(**rule_kwargs)


def log_rejected(client_id: Hashable, server_round: int, reason: str) -> None:
    log(WARNING, "round %s: update of client %s rejected (%s); its stored model is unchanged", server_round, client_id, reason)


def checked_payload(check: Callable[[Mapping[str, Any]], Any], payload: Mapping[str, Any]) -> Any:
    """``check(payload)``, with its ``ValueError`` turned into a rejection of the update."""
    try:
        return check(payload)
    except UpdateRejected:
        raise
    except ValueError as err:
        raise UpdateRejected(str(err)) from err
