"""Ditto and Per-FedAvg for the legacy Flower API."""

from __future__ import annotations

from typing import Any

from .client_personalized_servers import DittoServer, PerFedAvgServer
from .global_model import GlobalModelStrategy


class Ditto(GlobalModelStrategy):
    """Ditto (Li et al. 2021): FedAvg plus a personal model on every client, trained toward the
    global model with weight ``lam`` and evaluated. Other arguments are Flower's FedAvg's."""

    def __init__(self, *, lam: float = 1.0, **kwargs: Any) -> None:
        super().__init__(DittoServer(lam), **kwargs)


class PerFedAvg(GlobalModelStrategy):
    """Per-FedAvg (Fallah et al. 2020), first order: FedAvg of MAML-trained models; each client's
    personalized model is one step of size ``alpha`` on its training split. Other arguments are
    Flower's FedAvg's (its ``on_fit_config_fn`` supplies ``lr``, the outer step β)."""

    def __init__(self, *, alpha: float = 0.01, **kwargs: Any) -> None:
        super().__init__(PerFedAvgServer(alpha), **kwargs)
