"""The in-process grid delivers messages as the transport does: each node its own copy, the server its own
copy of each reply, so mods that edit what they receive behave as under ``flwr run``."""

from __future__ import annotations

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
