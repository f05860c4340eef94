"""Seeded, reproducible client sampling that no other thread can disturb.

Flower's own strategies sample with Python's global ``random``, which other threads of a
``flwr run`` (its heartbeats) also draw from at timing-dependent moments; the same seed then
gives different clients. ``Sampler`` owns its generators instead, orders clients by a stable
rank (their partition id) because Flower's node ids change from run to run, and its state can
be saved and restored with a checkpoint.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping
from typing import Any

import numpy as np

ClientId = Hashable


class Sampler:
    """``k`` of the available clients, uniformly, from generators seeded with ``seed``: one for
    training, one for evaluation (so evaluating a fraction never shifts the training sample).

    A draw picks positions in the rank order; how much randomness it takes depends only on how
    many clients are available and drawn, never on their ranks. So once every client has its
    rank, the samples are the same however late the ranks were learned.
    """

    def __init__(self, seed: int = 0, rank: Mapping[Any, int] | None = None) -> None:
        self.seed = seed
        #: a stable rank per client (e.g. its partition id); unranked clients come after, by id
        self.rank: dict[ClientId, int] = dict(rank or {})
        self._train = np.random.default_rng(seed)
        self._evaluate = np.random.default_rng([seed, 1])

    def key(self, cid: ClientId) -> tuple[float, ClientId]:
        """A client's place in rank order: its rank, then its id (unranked clients last)."""
        return self.rank.get(cid, math.inf), cid

    def order(self, available: Iterable[ClientId]) -> list[ClientId]:
        """The clients in rank order (the order every sample and every aggregation follows)."""
        return sorted(available, key=self.key)

    def sample(self, available: Iterable[ClientId], k: int, evaluation: bool = False) -> list[ClientId]:
        """``k`` distinct clients (all of them when fewer are available), in rank order."""
        pool = self.order(available)
        k = min(k, len(pool))
        rng = self._evaluate if evaluation else self._train
        return [pool[i] for i in sorted(rng.choice(len(pool), size=k, replace=False))]

    def state(self) -> dict[str, Any]:
        """The generators' states (JSON-serialisable), for a checkpoint."""
        return {"train": self._train.bit_generator.state, "evaluate": self._evaluate.bit_generator.state}

    def set_state(self, state: dict[str, Any]) -> None:
        self._train.bit_generator.state = state["train"]
        self._evaluate.bit_generator.state = state["evaluate"]
