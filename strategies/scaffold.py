"""SCAFFOLD for the legacy Flower API."""

from __future__ import annotations

from typing import Any

from .global_model import GlobalModelStrategy
from .scaffold_server import ScaffoldServer


class SCAFFOLD(GlobalModelStrategy):
    """SCAFFOLD (Karimireddy et al. 2020), option II: the server sends ``c`` (config key
    ``scaffold-control``, float32 bytes); each client keeps its ``c_i``, runs corrected local SGD
    and returns ``Δc_i`` as metric ``scaffold-control-delta`` (bytes). Needs ``initial_parameters``;
    sampling and evaluation are Flower's FedAvg's."""

    def __init__(self, *, server_learning_rate: float = 1.0, **kwargs: Any) -> None:
        super().__init__(ScaffoldServer(server_learning_rate), **kwargs)
