"""Reproducible client sampling when Flower's node ids are random.

A SuperLink gives nodes random ids on every run, so "the same seed samples the
same clients" needs a stable order. Before training the ServerApp asks every node
for its ``partition-id`` once (a ``query`` message) and ranks nodes by it: our
strategies sort by that rank, Flower's own see the grid's node ids in that order.
The same query returns each node's training label counts (and dominant label), used
only to group clients in diagnostic plots.
"""

from __future__ import annotations

import math
from logging import WARNING
from typing import Any

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid


def query_nodes(grid: Grid, timeout: float = 120.0) -> dict[int, dict[str, Any]]:
    """``node id -> {"partition-id", "dominant-label", "label-counts"}`` of every node that answers."""
    messages = [Message(RecordDict({"config": ConfigRecord()}), message_type=MessageType.QUERY, dst_node_id=n)
                for n in grid.get_node_ids()]
    info: dict[int, dict[str, Any]] = {}
    for reply in grid.send_and_receive(messages, timeout=timeout):
        if reply.has_error() or not reply.content.metric_records:
            continue
        metrics = next(iter(reply.content.metric_records.values()))
        if "partition-id" in metrics:
            info[reply.metadata.src_node_id] = {k: v if isinstance(v, list) else int(v) for k, v in metrics.items()}
    if len(info) < len(messages):
        log(WARNING, "%d of %d nodes did not report a partition-id; they are sampled after the others",
            len(messages) - len(info), len(messages))
    return info


class RankedGrid:
    """A grid whose ``get_node_ids`` lists nodes by rank; everything else is the wrapped grid's."""

    def __init__(self, grid: Grid, ranks: dict[int, int]) -> None:
        self._grid, self._ranks = grid, ranks

    def get_node_ids(self) -> list[int]:
        return sorted(self._grid.get_node_ids(), key=lambda n: (self._ranks.get(n, math.inf), n))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)
