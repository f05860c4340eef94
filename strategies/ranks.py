"""Node ranks for reproducible sampling in users' own apps, the same way in both APIs.

Flower's node ids change from run to run, so the strategies order nodes by a rank each node
reports under ``rank_key`` (by default its ``partition-id``; ``MethodServer.learn_rank``): from
any training or evaluation reply that carries it and, before a draw that meets nodes without one,
from one question per node and run where the app answers it (Message API: a QUERY message, asked only
with ``rank_query``, as a ClientApp without a query function fails it; legacy API: ``get_properties``,
which a client without one answers empty).
Nodes that never report one are ordered by node id, after the others, and a warning says so once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from logging import WARNING
from typing import Any, TypeVar

from flwr.common.logger import log

from flower_pfl.engine.method_server import MethodServer
from flower_pfl.engine.server_algorithm import ClientId

Row = TypeVar("Row", bound=tuple)
#: asks the given nodes for their rank; ``(node, what it reported)`` for those that answered
Ask = Callable[[list[ClientId]], Iterable[tuple[ClientId, Mapping[str, Any]]]]

MESSAGE_ADVICE = ("to rank them from the first draw, return '{key}' in a MetricRecord from your ClientApp's query "
                  "function (@app.query()) and give the strategy rank_query=True")
LEGACY_ADVICE = ("to rank them from the first draw, return '{key}' from your client's get_properties; fit and evaluate "
                 "metrics that carry it rank their clients from then on")


def learn_ranks(server: MethodServer, rows: Iterable[tuple[ClientId, Mapping[str, Any]]]) -> None:
    """Learn the rank each ``(node, metrics)`` reports under ``server.rank_key``; warn once about a shared rank."""
    if server.rank_key is None:
        return
    for node, metrics in rows:
        if server.rank_key in metrics and (problem := server.learn_rank(node, metrics[server.rank_key])) is not None:
            log(WARNING, "%s", problem)


def ranked_rows(server: MethodServer, rows: Sequence[Row]) -> list[Row]:
    """``(node, metrics, ...)`` rows in rank order, after learning the ranks they report (sums over
    them then do not depend on the order replies arrived in)."""
    learn_ranks(server, ((row[0], row[1]) for row in rows))
    return sorted(rows, key=lambda row: server.sampler.key(row[0]))


def prepare_draw(server: MethodServer, available: Sequence[ClientId], k: int, ask: Ask | None, advice: str) -> None:
    """Before ``k`` of ``available`` are drawn: ask the nodes without a rank that were not asked yet
    (``ask``; ``None``: nobody is asked), and warn once when some still have none. Nothing when all of
    them are taken (no draw), unless some clients never train: they are known by their rank."""
    if k >= len(available) and not server.new:
        return
    if ask is not None and (unasked := server.unasked(available)):
        probe = list(ask(unasked[:1]))  # one node first: an app that does not answer is asked once, not once per node
        if not probe:
            server.rank_query_unanswered()
        else:
            learn_ranks(server, probe)
            if len(unasked) > 1:
                learn_ranks(server, ask(unasked[1:]))
    if (problem := server.rank_problem(available, advice.format(key=server.rank_key))) is not None:
        log(WARNING, "%s", problem)
