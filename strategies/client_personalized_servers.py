"""Server side of the methods whose personalized model the client makes: the server trains a global
model by FedAvg and tells clients how to personalize it (Ditto, Per-FedAvg)."""

from __future__ import annotations

from typing import Any

from flower_pfl.methods.ditto import LAMBDA
from flower_pfl.methods.per_fedavg import ADAPT, ALPHA

from .global_server import FedAvgServer


class DittoServer(FedAvgServer):
    """Ditto: clients also train a personal model with ``lam / 2 ||v − w||²`` toward the global
    model, keep it in their state and evaluate it."""

    def __init__(self, lam: float = 1.0) -> None:
        super().__init__()
        if lam < 0:
            raise ValueError(f"Ditto's lambda must be >= 0, got {lam}")
        self.lam = lam

    def instructions(self, num_participants: int) -> dict[str, Any]:
        return {LAMBDA: self.lam}

    def evaluation_config(self) -> dict[str, Any]:
        return {LAMBDA: self.lam}


class PerFedAvgServer(FedAvgServer):
    """Per-FedAvg (first order): clients take MAML steps with inner step ``alpha`` and evaluate the
    global model after one step of size ``alpha`` on their training split."""

    def __init__(self, alpha: float = 0.01) -> None:
        super().__init__()
        if alpha <= 0:
            raise ValueError(f"Per-FedAvg's alpha must be > 0, got {alpha}")
        self.alpha = alpha

    def instructions(self, num_participants: int) -> dict[str, Any]:
        return {ALPHA: self.alpha}

    def evaluation_config(self) -> dict[str, Any]:
        return {ADAPT: self.alpha}
