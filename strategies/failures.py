"""Which nodes fail, since when and why: one console line per node and cause, lost nodes named once.

A Ray worker that dies or a SuperNode that goes away makes the same nodes fail round after round.
``NodeFailures`` counts each node's failures (``record``) and clears a node's streak when it answers
(``answered``). The first failure of a node with a cause is logged once; repeats are only counted, and
every reason is appended in full to ``log_file`` when one is set. A node that failed in
``lost_after`` consecutive rounds is *lost*: one warning names the lost nodes, the round since which
they fail and the cause, and ``NodeWatch`` (``strategies.nodes``) stops sampling them. ``report``
gives the closing account, one line per cause.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from logging import WARNING
from pathlib import Path
from typing import Any

from flwr.common.logger import log

from flower_pfl.engine.wording import agreeing, counted

#: a node that failed in this many consecutive rounds is lost (run config ``lost-node-rounds``)
LOST_AFTER = 3
#: the cause of a node that received an instruction and sent nothing back
NO_REPLY = "no reply"
#: the client of a legacy-API failure that names none (Flower's legacy loop passes the exception alone)
UNNAMED = None
#: the cause of a node the SuperLink stopped listing without a failure recorded first
DISCONNECTED = "disconnected"
#: the errors Ray gives for the messages of actors whose worker (its process, or the machine under it) is gone
RAY_ACTOR_LOSSES = frozenset({"ActorDiedError", "ActorUnavailableError", "RayActorError", "WorkerCrashedError", "NodeDiedError"})
#: Flower's wrappers around the error a client raised: the cause is the error inside
_WRAPPERS = frozenset({"ClientAppException", "Exception", "BaseException"})
_NAMES = re.compile(r"\b([A-Z]\w*(?:Error|Exception|Exit|Interrupt))\b")
#: how Flower's legacy API wraps a failed reply: ``ValueError('Message contains an Error (reason: ...)')``
_COMPAT = re.compile(r"Message contains an Error \(reason: (.*)\)", re.DOTALL)
#: an error the SuperLink makes itself: ``Error: Node Unavailable — ...``
_SUPERLINK = re.compile(r"Error: ([A-Z][\w ]*?) [-—]")


def failure_cause(reason: str) -> str:
    """The error's name in a failed reply's reason: the innermost error Flower or Ray names there
    (``ActorDiedError``, ``RuntimeError``), else the SuperLink's own error (``Node Unavailable``), else the
    reason's first line."""
    if inner := _COMPAT.search(reason):  # the legacy API's wrapping of a failed reply: the error inside it
        return failure_cause(inner.group(1))
    names = [n for n in _NAMES.findall(reason) if n not in _WRAPPERS]
    if names:
        return names[0]
    if superlink := _SUPERLINK.match(reason.strip()):
        return superlink.group(1)
    return (reason.strip().splitlines() or ["unknown error"])[0][:60]


def unwrap(reason: str) -> tuple[str, str] | None:
    """``(error class, message)`` of a reason a SuperNode or simulation wraps as ``<class 'pkg.Error'>:<'message'>``,
    else ``None``."""
    wrapped = re.fullmatch(r"<class '([^']+)'>:<'(.*)'>", reason.strip(), re.DOTALL)
    return None if wrapped is None else (wrapped.group(1), wrapped.group(2))


def listed(ids: Iterable[Any], shown: int = 5) -> str:
    """``3, 8``, or the first ``shown`` ids and how many more: ``1, 2, 3, 4, 5 and 12 more``."""
    ids = list(ids)
    return ", ".join(map(str, ids[:shown])) + (f" and {len(ids) - shown} more" if len(ids) > shown else "")


def _first_line(reason: str, limit: int = 160) -> str:
    """The reason's message, without Flower's ``<class '...'>:<'...'>`` or a ``repr``'s ``Error('...')`` around it."""
    if wrapped := unwrap(reason):
        reason = wrapped[1]
    elif quoted := re.fullmatch(r"\w+\((['\"])(.*)\1\)", reason.strip(), re.DOTALL):
        reason = quoted.group(2)
    lines = [line.strip() for line in reason.splitlines() if line.strip()]
    text = lines[0] if lines else reason.strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass
class Streak:
    """A node's failures: its latest cause, the first round of its current run of failing rounds,
    how many rounds that run has lasted, and its failures in all."""

    cause: str
    since: int
    rounds: int = 1
    last: int = 0
    total: int = 1


class NodeFailures:
    """Failures by node (see the module's docstring); ``lost_after = 0`` never declares a node lost."""

    def __init__(self, lost_after: int = LOST_AFTER, log_file: str | Path | None = None) -> None:
        if not (isinstance(lost_after, int) and lost_after >= 0):
            raise ValueError(f"lost_after must be an integer >= 0 (0: never), got {lost_after!r}")
        self.lost_after = lost_after
        self.log_file = Path(log_file) if log_file is not None else None
        #: the current failing streak of each node that failed and has not answered since
        self.streaks: dict[Any, Streak] = {}
        #: every node that failed in the run: its failures in all, first round and causes seen
        self.history: dict[Any, Streak] = {}
        #: the nodes declared lost, and their streak when they were
        self.lost: dict[Any, Streak] = {}
        self._told: set[tuple[Any, str]] = set()
        #: the latest round whose replies were recorded
        self.round = 0
        #: what the ids name: "node", or "client" where nodes host several clients (``server_apps.client_grid``)
        self.noun = "node"
        #: where the ids are clients: the node that hosts each (``ClientGrid.hosts``)
        self.hosts: Mapping[Any, int] = {}

    def record(self, server_round: int, node: Any, reason: str, phase: str = "") -> None:
        """A node that failed (``reason``: Flower's error reason) or never answered (``NO_REPLY``)."""
        cause = NO_REPLY if reason == NO_REPLY else failure_cause(reason)
        streak = self.streaks.get(node)
        if node is UNNAMED:  # a legacy failure that names no client: counted, never declared lost
            pass
        elif streak is None:
            self.streaks[node] = Streak(cause, server_round, last=server_round)
        else:
            streak.rounds += streak.last != server_round
            streak.last, streak.cause, streak.total = server_round, cause, streak.total + 1
        seen = self.history.setdefault(node, Streak(cause, server_round, rounds=0, total=0))
        seen.total, seen.last, seen.cause = seen.total + 1, server_round, cause
        if (node, cause) not in self._told:  # one line per node and cause; repeats are counted
            self._told.add((node, cause))
            what = "sent no reply" if cause == NO_REPLY else f"failed ({cause}: {_first_line(reason)})"
            who = "a client (the legacy API does not say which)" if node is UNNAMED else f"{self.noun} {node}"
            log(WARNING, "round %s: %s %s; its stored model is unchanged%s", server_round, who, what,
                "" if self.log_file is None else f" (repeats are counted; full reasons in {self.log_file})")
        self._write(server_round, node, phase, reason)

    def answered(self, node: Any) -> None:
        """A node that replied: its failing streak ends (a lost node stays lost)."""
        self.streaks.pop(node, None)

    def end_round(self, server_round: int) -> list[Any]:
        """Declare the nodes whose streak reached ``lost_after`` rounds lost (one warning per cause);
        returns them."""
        self.round = max(self.round, server_round)
        if not self.lost_after:
            return []
        new = {n: s for n, s in self.streaks.items() if s.rounds >= self.lost_after and n not in self.lost}
        self.lost.update(new)
        for cause in sorted({s.cause for s in new.values()}):
            nodes = sorted(n for n, s in new.items() if s.cause == cause)
            since = min(new[n].since for n in nodes)
            log(WARNING, "round %s: %s lost: %s failed in %s it was sent work, since round %s (%s); "
                "not sampled from now on (lost-node-rounds = %d)", server_round, _nodes(nodes, self.noun),
                agreeing(len(nodes), "it", "each"), agreeing(self.lost_after, "the last round", f"the last {self.lost_after} rounds"),
                since, cause, self.lost_after)
        return sorted(new)

    def disconnected(self, nodes: Iterable[Any]) -> None:
        """Nodes the SuperLink no longer lists after a round waited ``node-wait-timeout`` for them (a SuperNode
        gone): lost, with the cause and round of their last failure if they failed, else ``disconnected``."""
        new = sorted(n for n in nodes if n not in self.lost)
        if not self.lost_after or not new:
            return
        for node in new:
            seen = self.history.get(node)
            self.lost[node] = Streak(seen.cause, seen.since) if seen is not None else Streak(DISCONNECTED, self.round + 1)
        log(WARNING, "%s lost: no longer connected (%s); not sampled from now on", _nodes(new, self.noun),
            ", ".join(f"{n}: {self.lost[n].cause} since round {self.lost[n].since}" for n in new))

    def report(self) -> list[str]:
        """The run's failures, one line per cause: how many nodes, failures and since which round."""
        lines = []
        for cause in sorted({s.cause for s in self.history.values()}):
            nodes = sorted((n for n, s in self.history.items() if s.cause == cause), key=str)
            total = sum(self.history[n].total for n in nodes)
            since = min(self.history[n].since for n in nodes)
            lost = [n for n in nodes if n in self.lost]
            lines.append(f"{cause}: {counted(total, 'failure')} of {_nodes(nodes, self.noun)} since round {since}"
                         + ("" if not lost else ", lost" if len(nodes) == 1 else f", {len(lost)} of them lost"))
        return lines

    def summary(self) -> dict[str, object]:
        """The summary's account: nodes that failed, failures in all and by cause (``report``), the lost
        nodes with their cause and first failing round, and the file with the full reasons."""
        if not self.history:
            return {"failed_nodes": 0, "client_failures": 0}
        out: dict[str, object] = {
            "failed_nodes": len(self.history), "client_failures": sum(s.total for s in self.history.values()),
            "failures_by_cause": self.report(),
            "lost_nodes": {str(n): {"cause": s.cause, "since": s.since} for n, s in sorted(self.lost.items())}}
        if self.log_file is not None:
            out["failures_log"] = str(self.log_file)
        return out

    def _write(self, server_round: int, node: int, phase: str, reason: str) -> None:
        if self.log_file is None:
            return
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        with self.log_file.open("a") as fh:
            fh.write(f"{stamp} round {server_round} {self.noun} {node}{f' {phase}' if phase else ''}: {reason}\n")


def _nodes(nodes: Iterable[Any], noun: str = "node") -> str:
    """``node 7``, ``2 nodes [7, 9]``, or ``12 nodes [1, 2, 3, 4, 5 and 7 more]`` (``listed``)."""
    nodes = list(nodes)
    if nodes == [UNNAMED]:
        return "clients the legacy API did not name"
    return f"{noun} {nodes[0]}" if len(nodes) == 1 else f"{len(nodes)} {noun}s [{listed(nodes)}]"
