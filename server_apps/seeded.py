"""Flower's own strategies (FedAvg, FedProx, FedAvgM, FedAdam) sampled by the run's ``Sampler``.

They draw their participants with Python's global ``random``, which the ``flwr run`` runtime's
threads also use, so the same seed gave different clients. Here the package picks the round's
participants with its seeded ``Sampler`` and shows Flower's strategy only those nodes (Message
API: a grid that lists just them; legacy API: a client manager that samples with the
``Sampler``); replies are handed on in rank order, so sums over them do not depend on arrival.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from flwr.server.client_manager import SimpleClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.criterion import Criterion
from flwr.serverapp import Grid

from flower_pfl.engine.new_clients import NewClients
from flower_pfl.engine.sampling import Sampler


class SampledGrid:
    """A grid that lists only ``node_ids`` (in rank order); everything else is the wrapped grid's."""

    def __init__(self, grid: Grid, node_ids: list[int]) -> None:
        self._grid, self._node_ids = grid, node_ids

    def get_node_ids(self) -> list[int]:
        return list(self._node_ids)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)


class SeededClientManager(SimpleClientManager):
    """A legacy client manager whose ``sample`` draws with ``sampler`` and returns clients in rank order; a draw
    (a training round's) never picks a client of ``new`` (clients that never train)."""

    def __init__(self, sampler: Sampler, new: NewClients | None = None) -> None:
        super().__init__()
        self.sampler, self.new = sampler, new or NewClients(sampler)
        #: the strategy draws a training round's clients (``training``): never a new client, even when all are asked
        self.training = False
        self._lock = threading.Lock()

    @contextmanager
    def drawing_trainers(self) -> Iterator[None]:
        """Within: every draw is a training round's."""
        self.training = True
        try:
            yield
        finally:
            self.training = False

    def sample(self, num_clients: int, min_num_clients: int | None = None, criterion: Criterion | None = None) -> list[ClientProxy]:
        self.wait_for(min_num_clients if min_num_clients is not None else num_clients)
        with self._lock:
            clients = dict(self.clients)
        available = [node_id(cid) for cid, proxy in clients.items() if criterion is None or criterion.select(proxy)]
        if self.training:
            available = self.new.trainers(available)  # type: ignore[assignment]  # the ids it was given
        if num_clients > len(available):
            return []
        if num_clients == len(available):  # every client (e.g. evaluation): no draw, so training's sample stays put
            return [clients[str(n)] for n in self.sampler.order(available)]
        return [clients[str(n)] for n in self.sampler.sample(available, num_clients)]


def node_id(cid: str) -> int | str:
    """A legacy client id (a node id as a string) as the node id."""
    return int(cid) if cid.isdigit() else cid


def in_rank_order(sampler: Sampler, items: Iterable[Any], key: Any) -> list[Any]:
    """``items`` sorted by the rank of ``key(item)``'s client."""
    items = list(items)
    position = {cid: i for i, cid in enumerate(sampler.order({key(x) for x in items}))}
    return sorted(items, key=lambda x: position[key(x)])
