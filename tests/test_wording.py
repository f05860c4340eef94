"""Sentences the package builds from counts agree in number: one node, it, has; two nodes, they, have."""

from __future__ import annotations

import logging
import re

import pytest

from flower_pfl.engine.client_algorithm import Proximal
from flower_pfl.engine.client_contract import ignored_algorithm_message, missing_algorithm_message
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.engine.wording import agreeing, counted
from flower_pfl.methods.fedmcsa import FedMCSA
from flower_pfl.run.progress import summary_lines
from strategies.failures import NO_REPLY, NodeFailures

#: what a count of one, or a plural subject, must not be built into
DISAGREEING = [r"\b1 (nodes|clients|rounds|failures|replies)\b", r"\b1 clients'", r"\bthey was\b", r"\bit were\b",
               r"\beach [^.;]*\bthey\b", r"\b1 of \d+ \w+ have\b", r"\bthe last 1 rounds\b"]


def agrees(sentence: str) -> bool:
    return not any(re.search(pattern, sentence) for pattern in DISAGREEING)


def test_counted_and_agreeing():
    assert [counted(n, "node") for n in (0, 1, 2)] == ["0 nodes", "1 node", "2 nodes"]
    assert counted(1, "client's reply", "clients' replies") == "1 client's reply"
    assert counted(3, "client's reply", "clients' replies") == "3 clients' replies"
    assert [agreeing(n, "it was", "they were") for n in (1, 2)] == ["it was", "they were"]
    assert not agrees("each failed in the last 3 rounds they was sent work") and not agrees("1 nodes connected")


@pytest.mark.parametrize(("nodes", "rounds", "expected"), [
    ([7], 1, "round 1: node 7 lost: it failed in the last round it was sent work, since round 1 (no reply); "
              "not sampled from now on (lost-node-rounds = 1)"),
    ([7, 9], 3, "round 3: 2 nodes [7, 9] lost: each failed in the last 3 rounds it was sent work, since round 1 (no reply); "
                "not sampled from now on (lost-node-rounds = 3)")])
def test_the_lost_nodes_line(caplog, nodes, rounds, expected):
    failures = NodeFailures(lost_after=rounds)
    for rnd in range(1, rounds + 1):
        for node in nodes:
            failures.record(rnd, node, NO_REPLY)
        failures.end_round(rnd)
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and " lost: " in r.getMessage()]
    assert line == expected and agrees(line)
    assert failures.report() == [f"no reply: {counted(rounds * len(nodes), 'failure')} of "
                                 f"{'node 7' if len(nodes) == 1 else '2 nodes [7, 9]'} since round 1, "
                                 f"{'lost' if len(nodes) == 1 else '2 of them lost'}"]


@pytest.mark.parametrize(("unranked", "subject", "rest"), [
    (1, "1 of 3 nodes has not reported", "until a reply of its carries it, draws order it by node id"),
    (2, "2 of 3 nodes have not reported", "until a reply of theirs carries it, draws order them by node id")])
def test_the_unranked_nodes_line(unranked, subject, rest):
    server = MethodServer(FedMCSA(), 1, rank_key="partition-id")
    server.node_rank = {n: n for n in range(3 - unranked)}
    line = server.rank_problem(range(3), "advice")
    assert line is not None and line.startswith(subject) and rest in line and agrees(line)


@pytest.mark.parametrize("count", [1, 3])
def test_the_client_algorithm_lines(count):
    missing = missing_algorithm_message(FedMCSA(), "Proximal", count)
    ignored = ignored_algorithm_message(FedMCSA(), Proximal, count, 3)
    one = count == 1
    assert missing.startswith(f"{count} client's reply lacks" if one else f"{count} clients' replies lack")
    assert ": its ClientApp does not run it" in missing if one else ": their ClientApp does not run it" in missing
    assert ignored.startswith(f"{count} of 3 clients' replies {'lacks' if one else 'lack'} the receipt")
    assert all(agrees(line) for line in (missing, ignored))


@pytest.mark.parametrize(("rounds", "said"), [(1, "1 round in"), (12, "12 rounds in")])
def test_the_closing_line_counts_rounds(rounds, said, tmp_path):
    (line, *_) = summary_lines({"status": "completed", "num_rounds": rounds, "wall_time_s": 5.0}, tmp_path)
    assert f"run completed: {said}" in line and agrees(line)
