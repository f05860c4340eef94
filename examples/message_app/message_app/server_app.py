"""``@app.main()`` style: pick a flower-pfl strategy and ``start`` it as you would Flower's FedAvg."""

from __future__ import annotations

from logging import INFO

from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Strategy

import strategies.message as pfl
from message_app.task import Net

app = ServerApp()


def make_strategy(method: str, clients: int) -> Strategy:
    """Every strategy takes the method's own arguments, then how many nodes train and are waited for."""
    nodes = {"clients_per_round": clients, "min_available_nodes": clients}
    if method == "fedmcsa":
        return pfl.FedMCSA(sigma=50.0, lam=1.0, **nodes)
    if method == "fedacs":
        return pfl.FedACS(p=0.5, **nodes)
    if method == "scaffold":
        return pfl.SCAFFOLD(**nodes)
    if method == "igfl":
        return pfl.IGFL(attention="self", **nodes)
    raise ValueError(f"method must be fedmcsa, fedacs, scaffold or igfl, got {method!r}")


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    strategy = make_strategy(str(cfg["method"]), int(cfg["clients-per-round"]))
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(Net().state_dict()),
        num_rounds=int(cfg["num-rounds"]),
        train_config=ConfigRecord({"lr": float(cfg["lr"]), "local-steps": int(cfg["local-steps"])}),
    )
    for server_round, metrics in sorted(result.evaluate_metrics_clientapp.items()):
        log(INFO, "message-app: round %d accuracy %.4f", server_round, float(metrics["accuracy"]))
