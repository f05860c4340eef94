"""Which clients a node hosts, and each client's own ``Context`` on it.

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
_STATE = "c{}/"


def hosted_clients(node_config: Mapping[str, Any], num_clients: int) -> tuple[list[int], int]:
    """The ids of the clients this node hosts and the number of clients in the federation.

    ``num_clients`` is the run config's ``num-clients`` (0: as many as nodes). ``ValueError`` for a
    ``partition-ids`` that cannot be read or names a client outside the federation."""
    partitions = int(node_config["num-partitions"])
    if PARTITION_IDS in node_config:
        total = num_clients or partitions
        ids = parse_ids(str(node_config[PARTITION_IDS]))
        if outside := [c for c in ids if not 0 <= c < total]:
            raise ValueError(f"node config {PARTITION_IDS} = {node_config[PARTITION_IDS]!r} names clients {outside} "
                             f"outside the federation's {total} (0 to {total - 1})")
        return ids, total
    node = int(node_config["partition-id"])
    if not num_clients:
        return [node], partitions
    return list(range(node * num_clients // partitions, (node + 1) * num_clients // partitions)), num_clients


def parse_ids(text: str) -> list[int]:
    """``"0-2,7"`` -> ``[0, 1, 2, 7]``: comma-separated ids and inclusive ranges, each id once."""
    ids: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        first, sep, last = part.partition("-")
        try:
            span = range(int(first), int(last) + 1) if sep else range(int(first), int(first) + 1)
        except ValueError:
            raise ValueError(f"node config {PARTITION_IDS} = {text!r}: {part!r} is not a client id or a range "
                             "like 0-24") from None
        if not span:
            raise ValueError(f"node config {PARTITION_IDS} = {text!r}: the range {part!r} is empty")
        ids.extend(span)
    if len(set(ids)) != len(ids):
        raise ValueError(f"node config {PARTITION_IDS} = {text!r} names a client twice")
    return ids


def hosts_itself(node_config: Mapping[str, Any], num_clients: int) -> bool:
    """Whether the node hosts exactly the one client its ``partition-id`` names (the plain case: its
    messages are the client's own, not packs)."""
    if PARTITION_IDS in node_config:
        return False
    ids, _ = hosted_clients(node_config, num_clients)
    return ids == [int(node_config["partition-id"])]
