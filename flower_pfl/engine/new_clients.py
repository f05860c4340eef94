"""Clients that never train (``unseen-fraction``, ``unseen-domains``): who they are by rank, the clients that may
train, and what a new client's evaluation instruction adds. ``MethodServer`` leaves them out of its draws with it;
where Flower's own strategies (FedAvg, FedProx, FedAvgM, FedAdam) run, the ServerApp's recording wrappers and
seeded client manager do the same with it (those strategies send every client the global model: a new client's
model under any global-model method)."""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

from flower_pfl.engine.client_algorithm import FINETUNE_STEPS, NEW_CLIENT
from flower_pfl.engine.sampling import Sampler


@dataclass(frozen=True)
class NewClients:
    """The clients whose rank (partition id) is in ``unseen``, by ``sampler``'s ranks; ``finetune_steps``: the
    local steps each takes before it evaluates."""

    sampler: Sampler
    unseen: frozenset[int] = field(default_factory=frozenset)
    finetune_steps: int = 0

    def __bool__(self) -> bool:
        return bool(self.unseen)

    def is_new(self, client: Hashable) -> bool:
        rank = self.sampler.rank.get(client)
        return rank is not None and rank in self.unseen

    def trainers(self, clients: Iterable[Hashable]) -> list[Hashable]:
        """The clients that may train, in rank order."""
        return [c for c in self.sampler.order(clients) if not self.is_new(c)]

    def settings(self) -> dict[str, Any]:
        """The entries a new client's evaluation instruction gains (``MethodServer``'s own)."""
        return {NEW_CLIENT: True, **({FINETUNE_STEPS: self.finetune_steps} if self.finetune_steps else {})}
