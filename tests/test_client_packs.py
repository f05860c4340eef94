"""Nodes that host several clients: the pack format, which clients a node hosts, and the server's
``ClientGrid`` splitting each node's reply into one reply per client."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord, Error, Message, MessageType, MetricRecord, RecordDict

from client_apps.flower_internals import TaskIdentity
from client_apps.hosting import HostingError, hosted_clients, hosts_itself, parse_ids
from server_apps.client_grid import ClientGrid
from strategies.arrays import numpy_record
from strategies.client_packs import ERRORS, PACK, REPORT, Tally, is_pack, pack, unpack
from strategies.failures import NodeFailures
from strategies.nodes import split_replies


def _content(value: float) -> RecordDict:
    return RecordDict({"arrays": numpy_record({"w": np.full(2, value, dtype=np.float32)}), "config": ConfigRecord({"v": value})})


# --- the format ------------------------------------------------------------------------------------------


def test_a_pack_gives_each_client_its_records_and_stores_a_shared_record_once():
    shared = numpy_record({"w": np.arange(3, dtype=np.float32)})
    contents = {4: RecordDict({"arrays": shared, "config": ConfigRecord({"lr": 0.1})}),
                9: RecordDict({"arrays": shared, "config": ConfigRecord({"lr": 0.2})})}
    packed = pack(contents)
    assert is_pack(packed) and not is_pack(contents[4])
    assert len(packed.array_records) == 1  # the global model once, for both clients
    back, errors = unpack(packed)
    assert list(back) == [4, 9] and errors == {}
    assert back[9]["config"]["lr"] == 0.2 and np.array_equal(back[4]["arrays"]["w"].numpy(), np.arange(3))


def test_a_reply_pack_carries_each_failed_clients_reason_and_the_nodes_account():
    tally = Tally(together=3)
    tally.apart("its algorithm cannot run batched", 2)
    packed = pack({1: _content(1.0)}, errors={2: "ValueError('bad')"}, report=tally.record())
    contents, errors = unpack(packed)
    assert list(contents) == [1] and errors == {2: "ValueError('bad')"}
    again = Tally.from_record(packed.config_records[REPORT], 5)
    assert again == tally and again.one_by_one == 2
    assert again.report("clients_trained", "why") == {"clients_trained_together": 3, "clients_trained_one_by_one": 2,
                                                       "why": {"its algorithm cannot run batched": 2}}


def test_a_pack_whose_contents_do_not_match_its_records_is_refused():
    packed = pack({1: _content(1.0)})
    del packed[next(k for k in packed if k not in (PACK, ERRORS))]
    with pytest.raises(ValueError, match="client 1's record"):
        unpack(packed)
    packed = pack({1: _content(1.0)})
    packed[PACK]["clients"] = ["one"]
    with pytest.raises(ValueError, match="list of client ids"):
        unpack(packed)


# --- which clients a node hosts ----------------------------------------------------------------------------


def test_simulation_nodes_host_contiguous_blocks_that_cover_every_client_once():
    blocks = [hosted_clients({"partition-id": i, "num-partitions": 3}, 10) for i in range(3)]
    assert [b for b, _ in blocks] == [[0, 1, 2], [3, 4, 5], [6, 7, 8, 9]] and {t for _, t in blocks} == {10}
    assert hosted_clients({"partition-id": 2, "num-partitions": 3}, 0) == ([2], 3)  # one client per node
    assert hosts_itself({"partition-id": 2, "num-partitions": 3}, 0)
    assert hosts_itself({"partition-id": 2, "num-partitions": 3}, 3)
    assert not hosts_itself({"partition-id": 2, "num-partitions": 3}, 10)
    # 3 clients on 2 nodes: node 0 hosts client 0 alone, one of 3 (its data is the 1st third, not the 1st half)
    assert hosted_clients({"partition-id": 0, "num-partitions": 2}, 3) == ([0], 3)
    assert not hosts_itself({"partition-id": 0, "num-partitions": 2}, 3)


def test_a_deployed_node_names_its_clients():
    assert parse_ids("0-2, 7", 10) == [0, 1, 2, 7]
    assert hosted_clients({"partition-ids": "5-9", "num-partitions": 20}, 0) == ([5, 6, 7, 8, 9], 20)
    assert hosted_clients({"partition-ids": "5-9", "num-partitions": 20}, 20) == ([5, 6, 7, 8, 9], 20)
    assert not hosts_itself({"partition-ids": "3", "partition-id": 3, "num-partitions": 20}, 0)
    for bad, why in [("1,x", "'x' is not a client id"), ("4-2", "empty"), ("1,1", "twice"), ("5..9", "'5..9' is not"),
                     ("0-1000000000000", "up to 1000000000000, outside the federation's 20")]:
        with pytest.raises(HostingError, match=why):
            parse_ids(bad, 20)
    with pytest.raises(HostingError, match=r"up to 20, outside the federation's 20"):
        hosted_clients({"partition-ids": "18-20", "num-partitions": 20}, 0)
    with pytest.raises(HostingError, match="run config num-clients = 30, but this node's num-partitions = 20"):
        hosted_clients({"partition-ids": "18-19", "num-partitions": 20}, 30)


# --- the server's view: clients for nodes ------------------------------------------------------------------


class _Nodes:
    """A grid of two nodes hosting clients 0-2 (node 50) and 3-4 (node 60); each node answers a pack with each
    client's value doubled, except what ``answer`` makes it do."""

    def __init__(self, answer=None):
        self.answer = answer or {}
        self.sent: list[Message] = []

    def get_node_ids(self):
        return [50, 60]

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for msg in messages:
            self.sent.append(msg)
            node = msg.metadata.dst_node_id
            what = self.answer.get(node, "double")
            if what == "silent":
                continue
            if what == "error":
                replies.append(Message(Error(code=0, reason="ActorDiedError: the worker died"), reply_to=msg))
                continue
            contents, _ = unpack(msg.content)
            ok = {c: RecordDict({"metrics": MetricRecord({"value": 2 * float(x["config"]["v"])})}) for c, x in contents.items()
                  if not (what == "refuse-3" and c == 3)}
            tally = Tally(together=len(ok))
            replies.append(Message(pack(ok, errors={3: "ValueError('not finite')"} if what == "refuse-3" else None,
                                        report=tally.record()), reply_to=msg))
        return replies


def _messages(clients, kind=MessageType.TRAIN):
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    return [Message(_content(float(c)), dst_node_id=c, message_type=kind) for c in clients]


HOSTS = {0: 50, 1: 50, 2: 50, 3: 60, 4: 60}


def test_one_message_per_node_and_one_reply_per_client():
    nodes = _Nodes()
    grid = ClientGrid(nodes, HOSTS)
    assert grid.get_node_ids() == [0, 1, 2, 3, 4]
    sent = _messages([4, 0, 2])
    replies = grid.send_and_receive(sent)
    assert sorted(m.metadata.dst_node_id for m in nodes.sent) == [50, 60]
    assert sorted(unpack(next(m for m in nodes.sent if m.metadata.dst_node_id == 50).content)[0]) == [0, 2]
    good, failed = split_replies(1, replies, sent)
    assert failed == 0 and {c: m.content["metrics"]["value"] for c, m in good} == {0: 0.0, 2: 4.0, 4: 8.0}
    assert grid.training_report()["clients_trained_together"] == 3


def test_a_refused_client_fails_alone_and_a_failed_node_fails_its_clients_naming_them():
    grid = ClientGrid(_Nodes({50: "error", 60: "refuse-3"}), HOSTS)
    sent = _messages([0, 1, 3, 4])
    failures = NodeFailures(lost_after=0)
    failures.noun = "client"
    good, failed = split_replies(1, grid.send_and_receive(sent), sent, failures)
    assert [c for c, _ in good] == [4] and failed == 3
    assert failures.history.keys() == {0, 1, 3}
    assert failures.history[3].cause == "ValueError" and failures.history[0].cause == "ActorDiedError"
    reasons = {m.metadata.src_node_id: m.error.reason for m in grid.send_and_receive(_messages([0, 3])) if m.has_error()}
    assert reasons[0].startswith("node 50 (hosting clients 0, 1, 2) failed: ActorDiedError")
    assert failures.report()[0].startswith("ActorDiedError: 2 failures of 2 clients [0, 1]")


def test_a_silent_node_gives_its_clients_an_error_that_names_it_and_a_client_no_node_hosts_too():
    grid = ClientGrid(_Nodes({60: "silent"}), HOSTS)
    replies = {m.metadata.src_node_id: m for m in grid.send_and_receive(_messages([1, 3, 9]))}
    assert not replies[1].has_error()
    assert replies[3].error.reason == "no reply from node 60 (hosting clients 3, 4)"
    assert replies[9].error.reason == "no node hosts client 9"


def test_clients_of_a_node_that_left_are_not_listed():
    nodes = _Nodes()
    nodes.get_node_ids = lambda: [60]  # type: ignore[method-assign]
    assert ClientGrid(nodes, HOSTS).get_node_ids() == [3, 4]
