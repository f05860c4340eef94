"""SCAFFOLD for the Message API (``@app.main()`` + ``strategy.start``)."""

from __future__ import annotations

from typing import Any

from ..scaffold_server import ScaffoldServer
from .global_model import GlobalModelStrategy


class SCAFFOLD(GlobalModelStrategy):
    """SCAFFOLD (Karimireddy et al. 2020), option II: the server sends ``c`` (config key
    ``scaffold-control``, float32 bytes); each client keeps its ``c_i``, runs corrected local SGD
    and returns ``Δc_i`` (key ``scaffold-control-delta``) in a ConfigRecord of its reply. Sampling
    and evaluation are Flower's FedAvg's (its keyword arguments pass through)."""

    def __init__(self, *, server_learning_rate: float = 1.0, **kwargs: Any) -> None:
        super().__init__(ScaffoldServer(server_learning_rate), **kwargs)
