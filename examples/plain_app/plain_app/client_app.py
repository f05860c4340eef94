"""The app's ClientApp: plain SGD on the received model; metrics under the app's own names."""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from plain_app.task import Net, load_data, test, train

app = ClientApp()


def _received(msg: Message) -> torch.nn.Module:
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    return model


@app.train()
def train_fn(msg: Message, context: Context) -> Message:
    model = _received(msg)
    x, y, _, _ = load_data(int(context.node_config["partition-id"]))
    config = msg.content["config"]
    loss = train(model, x, y, float(config["lr"]), int(config["local-steps"]))
    return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()),
                               "metrics": MetricRecord({"train-loss": loss, "num-examples": len(y)})}), reply_to=msg)


@app.evaluate()
def evaluate_fn(msg: Message, context: Context) -> Message:
    _, _, x, y = load_data(int(context.node_config["partition-id"]))
    loss, acc = test(_received(msg), x, y)
    return Message(RecordDict({"metrics": MetricRecord({"eval-loss": loss, "eval-acc": acc, "num-examples": len(y)})}),
                   reply_to=msg)


@app.query()
def query_fn(msg: Message, context: Context) -> Message:
    """The node's stable name, so a strategy can sample the same clients for the same seed (flower-pfl's
    Message-API strategies ask for it with ``rank_query=True``)."""
    return Message(RecordDict({"metrics": MetricRecord({"partition-id": int(context.node_config["partition-id"])})}),
                   reply_to=msg)
