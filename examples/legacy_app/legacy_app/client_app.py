"""An ordinary NumPyClient: load the weights it gets, train, send them back."""

from __future__ import annotations

import numpy as np
import torch
from flwr.client import NumPyClient
from flwr.clientapp import ClientApp
from flwr.common import Context

from legacy_app.task import Net, load_data, test, train


class FlowerClient(NumPyClient):
    def __init__(self, partition_id: int, num_partitions: int) -> None:
        self.model = Net()
        self.x, self.y, self.x_test, self.y_test = load_data(partition_id, num_partitions)

    def set_weights(self, parameters: list[np.ndarray]) -> None:
        keys = self.model.state_dict().keys()
        self.model.load_state_dict({k: torch.tensor(v) for k, v in zip(keys, parameters)})

    def get_weights(self) -> list[np.ndarray]:
        return [v.numpy() for v in self.model.state_dict().values()]

    def fit(self, parameters, config):
        self.set_weights(parameters)
        loss = train(self.model, self.x, self.y, float(config["lr"]), int(config["local-steps"]))
        return self.get_weights(), len(self.y), {"train-loss": loss}

    def evaluate(self, parameters, config):
        self.set_weights(parameters)
        loss, accuracy = test(self.model, self.x_test, self.y_test)
        return loss, len(self.y_test), {"accuracy": accuracy}


def client_fn(context: Context):
    return FlowerClient(int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])).to_client()


app = ClientApp(client_fn=client_fn)
