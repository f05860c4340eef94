"""Legacy-API base for methods that train one global model on Flower's FedAvg with extra
server state (IGFL, SCAFFOLD): FedAvg samples and evaluates, a ``GlobalServer`` aggregates."""

from __future__ import annotations

from functools import partial
from typing import Any

from flwr.common import EvaluateIns, FitIns, FitRes, Parameters, Scalar, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import FedAvg

from .global_server import GlobalServer
from .legacy import collect_fit_results
from .personalized import check_update


class GlobalModelStrategy(FedAvg):
    """Flower's FedAvg with ``server``'s instructions added to every ``FitIns`` and its
    aggregation in place of the weighted mean. Needs ``initial_parameters``."""

    def __init__(self, server: GlobalServer, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if self.initial_parameters is None:
            raise ValueError(f"{type(self).__name__} needs initial_parameters")
        self.server = server
        server.initialize({str(i): a for i, a in enumerate(parameters_to_ndarrays(self.initial_parameters))})

    def _parameters_for(self, proxy: ClientProxy, default: Parameters, training: bool) -> Parameters:
        own = self.server.client_model(proxy.cid, training)
        return default if own is None else ndarrays_to_parameters(self.server.layout.to_numpy_list(own))  # type: ignore[union-attr]

    def configure_fit(self, server_round: int, parameters: Parameters, client_manager: ClientManager) -> list[tuple[ClientProxy, FitIns]]:
        self.server.begin_round(parameters_to_ndarrays(parameters), client_manager.num_available())
        pairs = super().configure_fit(server_round, parameters, client_manager)
        extras = self.server.instructions(len(pairs))
        return [(proxy, FitIns(self._parameters_for(proxy, ins.parameters, True), {**ins.config, **extras})) for proxy, ins in pairs]

    def configure_evaluate(self, server_round: int, parameters: Parameters, client_manager: ClientManager) -> list[tuple[ClientProxy, EvaluateIns]]:
        pairs = super().configure_evaluate(server_round, parameters, client_manager)
        extras = self.server.evaluation_config()
        return [(proxy, EvaluateIns(self._parameters_for(proxy, ins.parameters, False), {**ins.config, **extras}))
                for proxy, ins in pairs]

    def aggregate_fit(
        self, server_round: int, results: list[tuple[ClientProxy, FitRes]], failures: list[Any]
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        layout = self.server.layout
        batch = collect_fit_results(results, failures, server_round, partial(check_update, layout), self.server.check_payload)
        if not batch.ids:
            return None, dict(batch.metrics_dict())
        new = self.server.aggregate(batch.ids, batch.vectors, batch.payloads, [n for n, _ in batch.metrics])
        return ndarrays_to_parameters(layout.to_numpy_list(new)), dict(batch.metrics_dict())  # type: ignore[union-attr]
