"""The in-process grid delivers messages as the transport does: each node its own copy, the server its own
copy of each reply, so mods that edit what they receive behave as under ``flwr run``; and nodes take their
messages one at a time, as nodes with a process each do not share one."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import fabricate as fb
from flwr.app import ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from server_apps.inprocess import InProcessGrid


def _popping_mod(msg: Message, context: Context, call_next) -> Message:
    """Takes its setting out of the message it receives, as ``secaggplus_mod`` takes its stage."""
    msg.content["config"].pop("stage")
    return call_next(msg, context)


def _app() -> ClientApp:
    app = ClientApp(mods=[_popping_mod])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        context.state["kept"] = reply = MetricRecord({"keys": len(msg.content["config"]), "num-examples": 1})
        return Message(RecordDict({"metrics": reply}), reply_to=msg)

    return app


def test_every_node_gets_its_own_copy_of_a_shared_message_and_the_server_its_own_reply():
    fb.set_task_identity()
    grid = InProcessGrid(_app(), 3, {})
    content = RecordDict({"config": ConfigRecord({"stage": "setup", "other": 1})})  # one object for every node
    sent = [Message(content=content, dst_node_id=nid, message_type=MessageType.TRAIN) for nid in grid.get_node_ids()]
    replies = grid.send_and_receive(sent)
    assert [r.has_error() for r in replies] == [False] * 3
    assert dict(content["config"]) == {"stage": "setup", "other": 1}  # the mod edited the nodes' copies only
    replies[0].content["metrics"]["keys"] = 99  # the server edits a reply (as Flower's central-DP wrappers do)
    assert grid.contexts[grid.get_node_ids()[0]].state["kept"]["keys"] == 1


def test_a_transported_message_equals_a_deep_copy_and_shares_only_what_cannot_change():
    import copy

    import numpy as np
    from flwr.app import Array, ArrayRecord

    from server_apps.inprocess import transported

    fb.set_task_identity()
    model = ArrayRecord({"w": Array(np.arange(6, dtype=np.float32).reshape(2, 3))})
    content = RecordDict({"a.arrays": model, "b.arrays": model,  # one model for two clients of a pack
                          "a.config": ConfigRecord({"lr": 0.1, "ids": [1, 2], "name": "x", "raw": b"\x00"}),
                          "metrics": MetricRecord({"loss": [1.0, 2.0], "n": 3})})
    sent = Message(content=content, dst_node_id=7, message_type=MessageType.TRAIN)
    copied = transported(sent)
    assert copied.content == copy.deepcopy(sent).content and vars(copied.metadata) == vars(sent.metadata)
    assert copied.content["a.arrays"] is copied.content["b.arrays"]  # shared in the message, shared in the copy
    assert copied.content["a.arrays"] is not model and copied.content["a.arrays"]["w"] is not model["w"]
    assert copied.content["a.arrays"]["w"].data is model["w"].data  # bytes, which nobody can change
    copied.content["metrics"]["loss"].append(3.0)
    copied.content["a.config"]["ids"][0] = 9
    copied.content["a.arrays"]["w"].shape = (3, 2)
    copied.metadata.ttl = 1.0
    del copied.content["b.arrays"]
    assert sent.content["metrics"]["loss"] == [1.0, 2.0] and sent.content["a.config"]["ids"] == [1, 2]
    assert model["w"].shape == (2, 3) and "b.arrays" in sent.content and sent.metadata.ttl != 1.0


def test_nodes_take_their_messages_one_at_a_time_when_the_server_sends_from_several_threads():
    """Flower's legacy server asks every client from a thread of its own (``fit_clients``)."""
    fb.set_task_identity()
    app, lock, active, most = ClientApp(), threading.Lock(), [0], [0]

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        time.sleep(0.02)  # lets another thread in, were it allowed
        with lock:
            active[0] -= 1
        return Message(RecordDict({"metrics": MetricRecord({"num-examples": 1})}), reply_to=msg)

    grid = InProcessGrid(app, 6, {})
    sent = [Message(content=RecordDict(), dst_node_id=nid, message_type=MessageType.TRAIN) for nid in grid.get_node_ids()]
    with ThreadPoolExecutor(max_workers=6) as pool:
        replies = list(pool.map(lambda m: grid.send_and_receive([m])[0], sent))
    assert [r.has_error() for r in replies] == [False] * 6
    assert [r.metadata.src_node_id for r in replies] == grid.get_node_ids()
    assert most[0] == 1
