"""``server_fn`` style: the only change from a FedAvg app is the strategy line."""

from __future__ import annotations

from flwr.common import Context, ndarrays_to_parameters
from flwr.server import ServerApp, ServerAppComponents, ServerConfig

from legacy_app.task import Net
from strategies import FedACS  # was: from flwr.server.strategy import FedAvg


def server_fn(context: Context) -> ServerAppComponents:
    cfg = context.run_config
    initial = ndarrays_to_parameters([v.numpy() for v in Net().state_dict().values()])
    strategy = FedACS(  # was: FedAvg(fraction_fit=..., initial_parameters=initial, on_fit_config_fn=...)
        p=0.5,
        clients_per_round=int(cfg["clients-per-round"]),
        min_available_clients=int(cfg["clients-per-round"]),
        initial_parameters=initial,
        on_fit_config_fn=lambda server_round: {"lr": float(cfg["lr"]), "local-steps": int(cfg["local-steps"])},
    )
    return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=int(cfg["num-rounds"])))


app = ServerApp(server_fn=server_fn)
