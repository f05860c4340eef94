"""The federation's clients as the strategies' nodes, when a node hosts several clients.

``ClientGrid`` wraps the run's grid (``flwr run``'s, a SuperLink's, the in-process one). To the
strategies, every client is a node whose id is the client's id (its ``partition-id``), so sampling,
the per-client models, reply checks and failure accounting work on clients exactly as they do when
each node is one client. On the wire, a call's messages are grouped by the node that hosts their
clients and sent as one message per node (a pack, ``strategies.client_packs``); each node's
reply is split back into one reply per client:

- a client the node could not serve gets an error reply of its own: its node's other clients count;
- a node that fails, or sends nothing within the call's timeout, gives each of its clients an error
  reply that names the node and its clients;
- the nodes' accounts of how they ran their clients (as one computation, or one by one and why) add
  up in ``training_report``;
- the bytes of the messages to and from the nodes add up in ``wire`` (``strategies.traffic``): a record
  several of a node's clients share (FedAvg's global model) goes to that node once.

A client is connected while its node is (``get_node_ids``).
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from logging import INFO, WARNING
from typing import Any

from flwr.app import Error, Message, MessageType
from flwr.common.logger import log
from flwr.serverapp import Grid

from flower_pfl.engine.wording import counted
from server_apps.node_order import Answers, nodes_named
from strategies.client_packs import REPORT, Tally, pack, unpack
from strategies.failures import NO_REPLY, listed
from strategies.traffic import content_bytes

#: error code of a client's failure inside its node's reply (Flower's code for a ClientApp that raised)
CLIENT_FAILED = 1
#: error code of the clients of a node that failed or did not reply
NODE_FAILED = 2


class ClientGrid:
    """The part of ``flwr.serverapp.Grid`` strategies use, with clients for nodes (see the module)."""

    def __init__(self, grid: Grid, hosts: Mapping[int, int], learn: Callable[[list[int]], Answers] | None = None,
                 federation: int = 0) -> None:
        """``hosts``: client id -> the id of the node that hosts it; ``learn``: the start-up query's answers of
        nodes that connect later (``server_apps.node_order.ask``: their clients join, or come back to a node
        that reconnected with a new id); ``federation``: the federation's number of clients (0: unknown)."""
        self._grid = grid
        self.hosts = dict(hosts)
        self._clients: dict[int, list[int]] = {}
        self._index()
        self._learn, self.federation = learn, federation
        self._asked = set(self._clients)  # nodes whose clients are known, or that were asked
        #: clients that joined after the start, and clients that came back on a node that reconnected
        self.joined: list[int] = []
        self.taken_back: list[int] = []
        #: how the nodes trained and evaluated their clients
        self.training, self.evaluation = Tally(), Tally()
        #: the bytes of every message sent to the nodes (``"<type> down"``) and of their replies (``"<type> up"``),
        #: by message type, since the start
        self.wire: Counter[str] = Counter()

    def _index(self) -> None:
        self._clients = {}
        for client, node in self.hosts.items():
            self._clients.setdefault(node, []).append(client)

    def clients_of(self, node: int) -> list[int]:
        return list(self._clients.get(node, []))

    def get_node_ids(self) -> list[int]:
        """The clients whose node is connected (a node not seen before is asked which clients it hosts)."""
        connected = set(self._grid.get_node_ids())
        if self._learn is not None and (new := sorted(connected - self._asked)):
            self._asked.update(new)
            self._join(self._learn(new), connected)
        return [client for client, node in self.hosts.items() if node in connected]

    def _join(self, answers: Answers, connected: set[int]) -> None:
        """Take the clients of nodes that answered the start-up query after the start."""
        claims = {**answers.hosted, **{node: [{**about, "node": node}] for node, about in answers.info.items()}}
        for node, about in claims.items():
            clients = sorted(int(a["partition-id"]) for a in about)
            sizes = {a.get("num-partitions") for a in about}
            held = [c for c in clients if c in self.hosts and self.hosts[c] in connected]
            if self.federation and sizes != {self.federation}:
                why = f"says the federation has {listed(sorted(map(str, sizes)))} clients (num-partitions), not {self.federation}"
            elif held:
                hosts = sorted({self.hosts[c] for c in held})
                why = f"names clients {listed(held)}, which {nodes_named(hosts)}, still connected, host"
            else:
                back = [c for c in clients if c in self.hosts]
                self.taken_back.extend(back)
                self.joined.extend(c for c in clients if c not in self.hosts)
                self.hosts.update(dict.fromkeys(clients, node))
                self._index()
                log(INFO, "node %d joined the run with clients %s%s", node, listed(clients),
                    f" ({counted(len(back), 'client')} back from a node that left)" if back else "")
                continue
            log(WARNING, "node %d joined the run but %s: its clients %s are not taken", node, why, listed(clients))
        for node, why in answers.refused.items():
            log(WARNING, "node %d joined the run but cannot say which clients it hosts: %s", node, why)
        for why, nodes in answers.errors.items():
            log(WARNING, "%s joined the run but failed the start-up query: %s", nodes_named(nodes), why)

    def membership_report(self) -> dict[str, Any]:
        """The summary's entries on the federation's clients: those that joined late or came back on a
        reconnected node, and those no node hosted by the end."""
        missing = sorted(set(range(self.federation)) - set(self.hosts))
        return {**({"clients_joined_late": sorted(set(self.joined))} if self.joined else {}),
                **({"clients_taken_back": len(self.taken_back)} if self.taken_back else {}),
                **({"clients_never_hosted": missing} if missing else {})}

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        """Send ``messages`` (one per client) as one message per node; one reply per client."""
        groups: dict[tuple[int, str, str], list[Message]] = {}
        replies: list[Message] = []
        for msg in messages:
            meta = msg.metadata
            if not meta.message_id:  # as a grid does: the strategies match replies by it
                meta.__dict__["_message_id"] = uuid.uuid4().hex
            if meta.dst_node_id not in self.hosts:
                replies.append(Message(Error(code=NODE_FAILED, reason=f"no node hosts client {meta.dst_node_id}"), reply_to=msg))
                continue
            groups.setdefault((self.hosts[meta.dst_node_id], meta.message_type, meta.group_id), []).append(msg)
        sent = {}
        for (node, kind, group), inside in groups.items():
            packed = pack({m.metadata.dst_node_id: m.content for m in inside})
            sent[node, kind, group] = Message(packed, dst_node_id=node, message_type=kind, group_id=group or None,
                                              ttl=min(m.metadata.ttl for m in inside))
        for (_, kind, _), msg in sent.items():
            self.wire[f"{kind} down"] += content_bytes(msg.content)
        answered = self._grid.send_and_receive(list(sent.values()), timeout=timeout)
        for reply in answered:
            if not reply.has_error():
                self.wire[f"{reply.metadata.message_type} up"] += content_bytes(reply.content)
        by_id = {m.metadata.message_id: key for key, m in sent.items() if m.metadata.message_id}
        got: dict[tuple[int, str, str], Message] = {}
        for reply in answered:
            key = by_id.get(reply.metadata.reply_to_message_id)
            if key is None:  # a grid that sets no message ids (the in-process one): one message per node and type
                key = next((k for k in sent if k[0] == reply.metadata.src_node_id and k[1] == reply.metadata.message_type), None)
            if key is not None:
                got[key] = reply
        for key, inside in groups.items():
            replies.extend(self._split(key[0], inside, got.get(key)))
        return replies

    def _split(self, node: int, inside: list[Message], reply: Message | None) -> list[Message]:
        """One reply per client of ``inside`` from ``node``'s ``reply`` (``None``: none came)."""
        who = f"node {node} (hosting clients {listed(sorted(self.clients_of(node)))})"
        if reply is None:
            return [_failed(m, NODE_FAILED, f"{NO_REPLY} from {who}") for m in inside]
        if reply.has_error():
            return [_failed(m, reply.error.code, f"{who} failed: {reply.error.reason}") for m in inside]
        try:
            contents, errors = unpack(reply.content)
            report = reply.content.get(REPORT)
            account = None if report is None else Tally.from_record(report, len(inside))
        except (KeyError, ValueError) as err:  # a node's malformed reply costs its clients, never the run
            return [_failed(m, NODE_FAILED, f"{who} sent a malformed reply: {err}") for m in inside]
        tally = {MessageType.TRAIN: self.training, MessageType.EVALUATE: self.evaluation}.get(reply.metadata.message_type)
        if tally is not None and account is not None:
            tally.add(account)
        out = []
        for msg in inside:
            client = msg.metadata.dst_node_id
            if client in contents:
                out.append(Message(contents[client], reply_to=msg))
            else:
                out.append(_failed(msg, CLIENT_FAILED, errors.get(client, f"{who} sent no reply for client {client}")))
        return out

    def training_report(self) -> dict[str, Any]:
        """How the run's clients were trained and evaluated on their nodes: as one computation, or one by one
        and why; and who joined (``membership_report``)."""
        return {**self.training.report("clients_trained", "one_by_one_because"),
                **self.evaluation.report("clients_evaluated", "evaluated_one_by_one_because"), **self.membership_report()}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)


def _failed(msg: Message, code: int, reason: str) -> Message:
    return Message(Error(code=code, reason=reason), reply_to=msg)
