"""Ditto and Per-FedAvg for the Message API (``@app.main()`` + ``strategy.start``)."""

from __future__ import annotations

from typing import Any

from ..client_personalized_servers import DittoServer, PerFedAvgServer
from .global_model import GlobalModelStrategy


class Ditto(GlobalModelStrategy):
    """``strategies.Ditto`` for the Message API: the same method and arguments."""

    def __init__(self, *, lam: float = 1.0, **kwargs: Any) -> None:
        super().__init__(DittoServer(lam), **kwargs)


class PerFedAvg(GlobalModelStrategy):
    """``strategies.PerFedAvg`` for the Message API: the same method and arguments."""

    def __init__(self, *, alpha: float = 0.01, **kwargs: Any) -> None:
        super().__init__(PerFedAvgServer(alpha), **kwargs)
