"""IGFL for the legacy Flower API."""

from __future__ import annotations

from functools import partial
from typing import Any

from flwr.common import FitIns, FitRes, Parameters, Scalar, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import FedAvg

from .igfl_server import IGFLServer
from .legacy import collect_fit_results
from .personalized import check_update


class IGFL(FedAvg):
    """IGFL (Huang, Shang et al.): one global model; clients run IGFL-C (Algorithm 2) and the
    server aggregates their deltas with attention (AFL, Algorithm 3).

    ``attention``: ``"self"``, ``"global"``, ``"time"``, or ``None`` (plain mean of the deltas,
    IGFL-C alone); ``client_correction=False``: clients run plain local SGD (IGFL-S alone).
    Needs ``initial_parameters``; everything else is Flower's FedAvg (sampling, evaluation).
    """

    def __init__(self, *, attention: str | None = "self", client_correction: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if self.initial_parameters is None:
            raise ValueError("IGFL needs initial_parameters")
        self.igfl = IGFLServer(attention, client_correction)
        self.igfl.initialize({str(i): a for i, a in enumerate(parameters_to_ndarrays(self.initial_parameters))})

    def configure_fit(self, server_round: int, parameters: Parameters, client_manager: ClientManager) -> list[tuple[ClientProxy, FitIns]]:
        self.igfl.begin_round(parameters_to_ndarrays(parameters))
        pairs = super().configure_fit(server_round, parameters, client_manager)
        extras = self.igfl.instructions(len(pairs))
        return [(proxy, FitIns(ins.parameters, {**ins.config, **extras})) for proxy, ins in pairs]

    def aggregate_fit(
        self, server_round: int, results: list[tuple[ClientProxy, FitRes]], failures: list[Any]
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        layout = self.igfl.layout
        batch = collect_fit_results(results, failures, server_round, partial(check_update, layout))
        if not batch.ids:
            return None, dict(batch.metrics_dict())
        new = self.igfl.aggregate(batch.ids, batch.vectors)
        return ndarrays_to_parameters(layout.to_numpy_list(new)), dict(batch.metrics_dict())  # type: ignore[union-attr]
