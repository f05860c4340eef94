"""The same app in Flower's legacy API: a NumPyClient and a ``server_fn``."""

from __future__ import annotations

import json

import numpy as np
import torch
from flwr.client import NumPyClient
from flwr.clientapp import ClientApp
from flwr.common import Context, ndarrays_to_parameters
from flwr.server import ServerApp, ServerAppComponents, ServerConfig

from plain_app.server_app import strategy_from
from plain_app.task import Net, load_data, test, train


class PlainClient(NumPyClient):
    def __init__(self, partition_id: int) -> None:
        self.partition_id = partition_id
        self.model = Net()
        self.x, self.y, self.x_test, self.y_test = load_data(partition_id)

    def _load(self, parameters: list[np.ndarray]) -> None:
        self.model.load_state_dict({k: torch.tensor(v) for k, v in zip(self.model.state_dict(), parameters)})

    def get_properties(self, config):
        return {"partition-id": self.partition_id}

    def fit(self, parameters, config):
        self._load(parameters)
        loss = train(self.model, self.x, self.y, float(config["lr"]), int(config["local-steps"]))
        return [v.numpy() for v in self.model.state_dict().values()], len(self.y), {"train-loss": loss}

    def evaluate(self, parameters, config):
        self._load(parameters)
        loss, acc = test(self.model, self.x_test, self.y_test)
        return loss, len(self.y_test), {"eval-acc": acc}


def weighted_average(metrics: list[tuple[int, dict]]) -> dict:
    """Each evaluation metric's sample-weighted mean (what Flower's legacy FedAvg is usually given)."""
    total = sum(n for n, _ in metrics)
    return {key: sum(n * m[key] for n, m in metrics) / total for key in metrics[0][1]}


def client_fn(context: Context):
    return PlainClient(int(context.node_config["partition-id"])).to_client()


def server_fn(context: Context) -> ServerAppComponents:
    cfg = context.run_config
    lr, steps = float(cfg["lr"]), int(cfg["local-steps"])
    path = str(cfg["strategy"])
    weights = Net().state_dict()  # flower-pfl's strategies take it with its names (layers and biases are found by name)
    initial = weights if path.startswith("strategies.") else ndarrays_to_parameters([v.numpy() for v in weights.values()])
    strategy = strategy_from(path, {
        "fraction_fit": float(cfg["fraction-train"]),
        "initial_parameters": initial,
        "on_fit_config_fn": lambda server_round: {"lr": lr, "local-steps": steps},
        "evaluate_metrics_aggregation_fn": weighted_average,
        **json.loads(str(cfg["strategy-args"]))})
    return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=int(cfg["num-rounds"])))


client_app = ClientApp(client_fn=client_fn)
server_app = ServerApp(server_fn=server_fn)
