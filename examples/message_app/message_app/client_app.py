"""The user's ClientApp: load the received arrays, train with the method's algorithm, reply."""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from client_apps.own_loop import algorithm_for
from message_app.task import Net, load_data, test, train

app = ClientApp()


def _model(msg: Message) -> torch.nn.Module:
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    return model


@app.train()
def train_fn(msg: Message, context: Context) -> Message:
    model = _model(msg)
    x, y, _, _ = load_data(int(context.node_config["partition-id"]), int(context.node_config["num-partitions"]))
    config = msg.content["config"]
    algorithm = algorithm_for(config, model, context.state)  # e.g. FedMCSA's proximal term, SCAFFOLD's c - c_i
    loss = train(model, x, y, float(config["lr"]), int(config["local-steps"]), algorithm)
    extras = algorithm.finish(model, x)  # what the strategy needs back: the step's receipt, e.g. SCAFFOLD's delta c_i
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()),
                          "metrics": MetricRecord({"train-loss": loss, "num-examples": len(y)})})
    if extras:
        content["extras"] = ConfigRecord(extras)
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate_fn(msg: Message, context: Context) -> Message:
    model = _model(msg)
    _, _, x_test, y_test = load_data(int(context.node_config["partition-id"]), int(context.node_config["num-partitions"]))
    loss, accuracy = test(model, x_test, y_test)
    metrics = MetricRecord({"loss": loss, "accuracy": accuracy, "num-examples": len(y_test)})
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)
