"""Which clients a node hosts.

The federation's unit is the client; a node (a SuperNode, or a virtual one in simulation) hosts one
client or several:

- simulation: run config ``num-clients`` = C (0, the default: one client per node) spread over the N
  virtual nodes in contiguous blocks: node ``i`` (its node config's ``partition-id``) hosts clients
  ``floor(i·C/N) .. floor((i+1)·C/N) − 1``;
- deployment: the node config's ``partition-ids`` names them (``"0-24"``, ``"0,3,7"``, ``"0-9,20"``),
  with ``num-partitions`` the number of clients in the federation.

Each hosted client is seen by the client code exactly as a node of its own: a ``Context`` whose node
config says its ``partition-id`` and the federation's ``num-partitions``, and whose ``state`` is the
client's own (``client_apps.client_states``: what a client keeps between rounds, such as control
variates or personal models, stays the client's, in a file of its own on the node).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: node config key (deployment): the clients a node hosts
PARTITION_IDS = "partition-ids"
#: node config key: how many of a round's clients the node trains as one computation (the run config's
#: ``clients-per-computation`` where the node config has none; 0: as many as its memory holds)
CLIENTS_PER_COMPUTATION = "clients-per-computation"
#: the record (and its key) of a node's answer to the start-up query when ``HostingError`` says its node config is wrong
HOSTING = "hosting"


class HostingError(ValueError):
    """A node config that does not say which clients of the federation the node hosts: the server stops the
    run at start, naming the node (``server_apps.node_order``)."""


def hosted_clients(node_config: Mapping[str, Any], num_clients: int) -> tuple[list[int], int]:
    """The ids of the clients this node hosts and the number of clients in the federation.

    ``num_clients`` is the run config's ``num-clients`` (0: as many as nodes). With ``partition-ids`` (a
    deployment) the node config's ``num-partitions`` is the federation's number of clients, and a run config
    that says another is refused. ``HostingError`` for a node config that cannot be read, names a client
    outside the federation or disagrees with the run config."""
    partitions = _count(node_config, "num-partitions")
    if PARTITION_IDS in node_config:
        if num_clients and num_clients != partitions:
            raise HostingError(f"run config num-clients = {num_clients}, but this node's num-partitions = {partitions} "
                               f"says the federation has {partitions} clients: in a deployment the nodes' num-partitions "
                               "names the federation's clients (leave num-clients at 0)")
        return parse_ids(str(node_config[PARTITION_IDS]), partitions), partitions
    node = _count(node_config, "partition-id")
    if not num_clients:
        return [node], partitions
    return list(range(node * num_clients // partitions, (node + 1) * num_clients // partitions)), num_clients


def _count(node_config: Mapping[str, Any], key: str) -> int:
    value = node_config.get(key)
    if isinstance(value, bool) or not isinstance(value, int | str) or not str(value).strip().isdigit():
        raise HostingError(f"node config {key} = {value!r}: a whole number is needed (e.g. --node-config "
                           f"\"partition-id=0 num-partitions=2\")")
    return int(value)


def parse_ids(text: str, total: int) -> list[int]:
    """``"0-2,7"`` -> ``[0, 1, 2, 7]``: comma-separated ids and inclusive ranges, each id once, all in the
    federation's ``total`` clients (checked before the ids are listed)."""
    spans: list[range] = []
    for part in (p.strip() for p in text.split(",")):
        first, sep, last = part.partition("-")
        if not first.strip().isdigit() or (sep and not last.strip().isdigit()):
            raise HostingError(f"node config {PARTITION_IDS} = {text!r}: {part!r} is not a client id or a range "
                               "like 0-24")
        span = range(int(first), int(last) + 1) if sep else range(int(first), int(first) + 1)
        if not span:
            raise HostingError(f"node config {PARTITION_IDS} = {text!r}: the range {part!r} is empty")
        if span[-1] >= total:
            raise HostingError(f"node config {PARTITION_IDS} = {text!r} names clients up to {span[-1]}, outside the "
                               f"federation's {total} (0 to {total - 1}; num-partitions = {total})")
        spans.append(span)
    if sum(len(s) for s in spans) != len(set().union(*spans)):
        raise HostingError(f"node config {PARTITION_IDS} = {text!r} names a client twice")
    return [c for span in spans for c in span]


def hosts_itself(node_config: Mapping[str, Any], num_clients: int) -> bool:
    """Whether the node hosts exactly the one client its ``partition-id`` names, of a federation of as many
    clients as nodes (the plain case: its messages are the client's own, not packs). A node hosting one of
    3 clients on 2 nodes is not: its client is one of 3, not of the nodes' ``num-partitions``."""
    if PARTITION_IDS in node_config:
        return False
    ids, total = hosted_clients(node_config, num_clients)
    return ids == [int(node_config["partition-id"])] and total == int(node_config["num-partitions"])
