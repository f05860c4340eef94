"""Waiting for nodes, bounded, and naming nodes correctly in replies."""

from __future__ import annotations

import time
from collections.abc import Iterable
from logging import INFO, WARNING
from typing import Any

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.common.logger import log

from flower_pfl.engine.wording import agreeing, counted
from strategies.failures import LOST_AFTER, NO_REPLY, NodeFailures

#: seconds a round waits for missing nodes before it goes on with those connected (run config ``node-wait-timeout``)
NODE_WAIT_TIMEOUT = 120.0


class NodeWatch:
    """The nodes a strategy has seen, and a bounded wait for enough of them.

    ``wait(grid, needed)`` returns the connected nodes once ``needed`` are there, or, after
    ``timeout`` seconds, the ones that are (logging which nodes seen before are missing), so a
    lost node never stalls a run for ever. Having gone on with ``n`` nodes, later rounds go on
    without waiting while at least ``n`` are connected (a node lost for good costs one wait, not one
    per round); fewer start a new wait. The nodes missing after such a wait, and the nodes that kept
    failing (``failures``, ``strategies.failures``), are lost: never returned again in this run, nor
    waited for. A node that comes back gets a new node id unless it authenticates; it is then a new
    client to the strategy.
    """

    def __init__(self, timeout: float = NODE_WAIT_TIMEOUT, poll: float = 1.0, lost_after: int = LOST_AFTER) -> None:
        if not timeout >= 0:
            raise ValueError(f"node_wait_timeout must be >= 0 seconds, got {timeout!r}")
        self.timeout, self.poll = timeout, poll
        #: the nodes' failures; the lost ones are not returned by ``wait`` (``strategies.failures``)
        self.failures = NodeFailures(lost_after)
        self.seen: set[int] = set()
        #: how many nodes the last wait that timed out went on with (None: no shortfall accepted)
        self.settled: int | None = None

    def alive(self, node_ids: Iterable[int]) -> list[int]:
        """``node_ids`` without the lost nodes."""
        return [n for n in node_ids if n not in self.failures.lost]

    def wait(self, grid: Any, needed: int) -> list[int]:
        lost = self.failures.lost
        enough = needed if self.settled is None else min(needed, self.settled)
        if lost:  # lost nodes are not waited for
            enough = min(enough, max(len(self.seen - set(lost)), 1))
        deadline, shown = time.monotonic() + self.timeout, -1.0
        while len(nodes := self.alive(grid.get_node_ids())) < enough:
            now = time.monotonic()
            if now >= deadline:
                missing = sorted(self.seen - set(nodes) - set(lost))
                log(WARNING, "%s connected, %d wanted; going on with %s after %.0f s%s", counted(len(nodes), "node"), needed,
                    agreeing(len(nodes), "it", "them"), self.timeout, f" (missing since an earlier round: {missing})" if missing else "")
                self.failures.disconnected(missing)
                self.settled = len(nodes)
                break
            if now - shown >= 10:
                log(INFO, "Waiting for nodes: %d connected, %d needed (at most %.0f s more)", len(nodes), enough, deadline - now)
                shown = now
            time.sleep(self.poll)
        if len(nodes) >= needed and not lost:
            self.settled = None
        self.seen.update(nodes)
        return nodes


def senders(sent: Iterable[Message]) -> dict[str, int]:
    """Message id -> the node it went to, for the messages a strategy sent (ids are set when sent)."""
    return {m.metadata.message_id: m.metadata.dst_node_id for m in sent if m.metadata.message_id}


def sender(reply: Message, sent_to: dict[str, int]) -> int:
    """The node a reply answers for: errors the SuperLink makes for an unreachable node carry the
    SuperLink's own id as their source, so the instruction's destination is used."""
    return sent_to.get(reply.metadata.reply_to_message_id, reply.metadata.src_node_id)


def query(grid: Any, node_ids: Iterable[int], timeout: float, config: ConfigRecord | None = None) -> list[tuple[int, Message]]:
    """Send each of ``node_ids`` a QUERY message (ConfigRecord ``config``, empty by default); ``(node, reply)``
    for the replies that came within ``timeout`` seconds, errors included."""
    messages = [Message(RecordDict({"config": ConfigRecord(dict(config or {}))}), message_type=MessageType.QUERY, dst_node_id=n)
                for n in node_ids]
    replies = list(grid.send_and_receive(messages, timeout=timeout))
    sent_to = senders(messages)  # ids are set once sent; a reply the SuperLink makes itself comes from node 1
    return [(sender(reply, sent_to), reply) for reply in replies]


def split_replies(server_round: int, replies: Iterable[Message], sent: Iterable[Message],
                  failures: NodeFailures | None = None) -> tuple[list[tuple[int, Message]], int]:
    """``(node, reply)`` for the replies that carry content, and how many of the nodes ``sent``
    went to failed or never answered, each recorded in ``failures`` (``strategies.failures``: one line per
    node and cause; without ``failures``, every failure is logged)."""
    failures = failures if failures is not None else NodeFailures(lost_after=0)
    sent = list(sent)
    sent_to = senders(sent)
    phase = str(sent[0].metadata.message_type) if sent else ""
    answered: set[int] = set()
    good: list[tuple[int, Message]] = []
    failed = 0
    for msg in replies:
        node_id = sender(msg, sent_to)
        answered.add(node_id)
        if msg.has_error():
            failed += 1
            failures.record(server_round, node_id, msg.error.reason or "", phase)
        else:
            good.append((node_id, msg))
            failures.answered(node_id)
    silent = sorted(set(sent_to.values()) - answered)
    for node_id in silent:
        failures.record(server_round, node_id, NO_REPLY, phase=phase)
    failures.end_round(server_round)
    return good, failed + len(silent)
