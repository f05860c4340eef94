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
from collections.abc import Mapping
from dataclasses import dataclass, field
from logging import WARNING
from typing import Any

from flwr.app import ConfigRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from client_apps.hosting import HOSTING
from client_apps.persisted_state import CLIENT_STATE
from flower_pfl.engine.wording import agreeing, counted
from flower_pfl.experiment.clients import CLIENT_GROUP
from flower_pfl.experiment.config import ConfigError
from strategies.client_packs import is_pack, unpack
from strategies.failures import listed, unwrap
from strategies.nodes import query

#: seconds the start-up query waits for the nodes' answers
QUERY_TIMEOUT = 120.0
#: how Flower's simulation wraps a ClientApp's exception message
RAY_MESSAGE = "Exception ClientAppException occurred. Message: "


def query_nodes(grid: Grid, timeout: float = QUERY_TIMEOUT, config: Mapping[str, Any] | None = None) -> dict[int, dict[str, Any]]:
    """``node id -> {"partition-id", "num-partitions", "dominant-label", "label-counts"}`` (and ``"client-group"``, the natural
    group or domain of the node's data, where it has one) of every node that answers
    (``config``: what the query asks besides; a node that lacks a resumed run's client state adds
    ``"client-state-missing"``, its message).

    Where a node hosts several clients (``client_apps.hosting``), it answers for each of them, and the
    result is by client id (its ``partition-id``) for every client, each with ``"node"``, the id of the
    node that hosts it (``server_apps.client_grid``).

    Every node loads its data and model to answer, so a run config they cannot serve fails here, before
    any training: ``ConfigError`` with the nodes' errors when no node answers and some report an error,
    when a node's config does not say which clients it hosts (``client_apps.hosting.HostingError``), when
    two nodes host one client, and when nodes disagree on the federation's number of clients. Nodes that
    fail while others answer, and nodes that claim the same partition, are logged as warnings."""
    asked = list(grid.get_node_ids())
    found = ask(grid, asked, timeout, config)
    if found.refused:
        shown = "; ".join(f"node {node}: {why}" for node, why in sorted(found.refused.items())[:5])
        raise ConfigError(f"{counted(len(found.refused), 'node')} cannot say which clients {agreeing(len(found.refused), 'it hosts', 'they host')}: "
                          f"{shown}")
    info = found.info
    if found.hosted:
        info = _by_client(info, found.hosted)
        if len(sizes := {about.get("num-partitions") for about in info.values()}) > 1:
            by_size = {size: sorted({about["node"] for about in info.values() if about.get("num-partitions") == size})
                       for size in sizes}
            shown = "; ".join(f"{nodes_named(nodes)}: {size}" for size, nodes in by_size.items())
            raise ConfigError(f"the nodes disagree on the federation's number of clients (num-partitions: {shown}): "
                              "every node must give the same, as each client's data depends on it")
    _report(info, found.errors, len(asked), by_client=bool(found.hosted))
    return info


@dataclass
class Answers:
    """The nodes' answers to a query: the clients of nodes that are their one client (by node), of nodes that
    host several (by node), the nodes that failed (by error) and the nodes whose node config does not say
    which clients they host (``client_apps.hosting.HostingError``, by node)."""

    info: dict[int, dict[str, Any]] = field(default_factory=dict)
    hosted: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    errors: dict[str, list[int]] = field(default_factory=dict)
    refused: dict[int, str] = field(default_factory=dict)


def ask(grid: Grid, nodes: list[int], timeout: float, config: Mapping[str, Any] | None = None) -> Answers:
    """Ask ``nodes`` the start-up query (``query_nodes``) and sort their answers (``Answers``); a node's
    malformed answer is one of its errors."""
    found = Answers()
    for node, reply in query(grid, nodes, timeout, ConfigRecord(dict(config or {}))):
        if reply.has_error():
            found.errors.setdefault(_gist(reply.error.reason or ""), []).append(node)
        elif HOSTING in reply.content:
            record = reply.content[HOSTING]
            found.refused[node] = str(record.get(HOSTING, "")) if isinstance(record, ConfigRecord) else "a malformed answer"
        elif is_pack(reply.content):
            try:
                contents, failed = unpack(reply.content)
                answers = [_about(c) for c in contents.values()]
            except ValueError as err:  # a node's malformed answer costs its clients, never the run
                found.errors.setdefault(f"a malformed answer ({err})", []).append(node)
                continue
            found.hosted[node] = [{**about, "node": node} for about in answers if "partition-id" in about]
            by_gist: dict[str, list[int]] = {}
            for client, why in failed.items():
                by_gist.setdefault(_gist(why), []).append(client)
            for why, clients in by_gist.items():  # the node's error where all its clients have it
                found.errors.setdefault(why if not contents else f"clients {listed(sorted(clients))}: {why}", []).append(node)
        else:
            try:
                about = _about(reply.content)
            except ValueError as err:
                found.errors.setdefault(f"a malformed answer ({err})", []).append(node)
                continue
            if about:
                found.info[node] = about
    return found


def _about(content: RecordDict) -> dict[str, Any]:
    """What one client's answer says: its partition id, label counts, group, missing client state."""
    about: dict[str, Any] = {}
    if content.metric_records:
        metrics = next(iter(content.metric_records.values()))
        if "partition-id" in metrics:
            try:
                about = {k: v if isinstance(v, list) else int(v) for k, v in metrics.items()}
            except (OverflowError, ValueError) as err:  # NaN or Inf
                raise ValueError(f"its metrics are not whole numbers ({err})") from None
            if not isinstance(about["partition-id"], int) or about["partition-id"] < 0:
                raise ValueError(f"its partition-id is {about['partition-id']!r}, not a client id")
    if CLIENT_GROUP in content.config_records:
        about[CLIENT_GROUP] = str(content.config_records[CLIENT_GROUP][CLIENT_GROUP])
    if CLIENT_STATE in content.config_records:
        about["client-state-missing"] = str(content.config_records[CLIENT_STATE]["missing"])
    return about


def _by_client(single: dict[int, dict[str, Any]], hosted: dict[int, list[dict[str, Any]]]) -> dict[int, dict[str, Any]]:
    """Every client's answer by its id, with its node; ``ConfigError`` when two nodes host the same client."""
    nodes: dict[int, list[int]] = {}
    out: dict[int, dict[str, Any]] = {}
    answers = [{**about, "node": node} for node, about in single.items() if "partition-id" in about]
    for about in answers + [a for clients in hosted.values() for a in clients]:
        client = int(about["partition-id"])
        nodes.setdefault(client, []).append(about["node"])
        out[client] = about
    if shared := {c: n for c, n in nodes.items() if len(n) > 1}:
        shown = "; ".join(f"client {c} on {nodes_named(n)}" for c, n in sorted(shared.items())[:5])
        raise ConfigError(f"{counted(len(shared), 'client')} hosted by more than one node ({shown}): each client must be "
                          "hosted by one node (check the nodes' partition-ids)")
    return dict(sorted(out.items()))


def _gist(reason: str) -> str:
    """A node's error without its wrapping: a SuperNode's ``<class 'pkg.Error'>:<'message'>`` becomes
    ``Error: message``; a simulation's (Ray's traceback, which names its worker process) only the message."""
    wrapped = unwrap(reason)
    if wrapped is None:
        return reason
    kind, message = wrapped
    if RAY_MESSAGE in message:
        return message.rsplit(RAY_MESSAGE, 1)[1].strip()
    return f"{kind.rsplit('.', 1)[-1]}: {message}"


def nodes_named(ids: list[int], shown: int = 5) -> str:
    """``node 3``, ``nodes 3, 8``, or the first ``shown`` and how many more: ``nodes 1, 2, 3, 4, 5 and 12 more``."""
    ids = sorted(ids)
    text = listed(ids, shown)
    return f"{agreeing(len(ids), 'node', 'nodes')} {text}"


def _report(info: dict[int, dict[str, Any]], errors: dict[str, list[int]], asked: int, by_client: bool = False) -> None:
    """Raise when every node failed; warn about failed nodes and nodes sharing a partition-id."""
    if errors and not info:
        shown = sorted(errors.items(), key=lambda item: -len(item[1]))[:3]
        more = f" (and {len(errors) - len(shown)} other errors)" if len(errors) > len(shown) else ""
        raise ConfigError(f"no node could serve this run config; {'; '.join(f'{nodes_named(ids)}: {why}' for why, ids in shown)}{more}")
    for why, ids in errors.items():
        log(WARNING, "%s failed to answer the start-up query: %s", nodes_named(ids), why)
    if len(info) < asked and not by_client:
        unranked = asked - len(info)
        log(WARNING, "%d of %s did not report a partition-id; %s sampled after the others", unranked, counted(asked, "node"),
            agreeing(unranked, "it is", "they are"))
    claims: dict[int, list[int]] = {}
    for node, about in info.items():
        claims.setdefault(about["partition-id"], []).append(node)
    for pid, nodes in sorted(claims.items()):
        if len(nodes) > 1:
            log(WARNING, "%s all report partition-id %d: they train on the same data, and their order among "
                "themselves (by node id) changes from run to run", nodes_named(nodes), pid)


class RankedGrid:
    """A grid whose ``get_node_ids`` lists nodes by rank; everything else is the wrapped grid's."""

    def __init__(self, grid: Grid, ranks: dict[int, int]) -> None:
        self._grid, self._ranks = grid, ranks

    def get_node_ids(self) -> list[int]:
        return sorted(self._grid.get_node_ids(), key=lambda n: (self._ranks.get(n, math.inf), n))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)
