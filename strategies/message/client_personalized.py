"""Ditto, Per-FedAvg, pFedMe and APFL for the Message API (``@app.main()`` + ``strategy.start``)."""

from __future__ import annotations

from typing import Any

from ..client_personalized_servers import APFLServer, DittoServer, PerFedAvgServer, PFedMeServer
from .global_model import GlobalModelStrategy


class Ditto(GlobalModelStrategy):
    """``strategies.Ditto`` for the Message API: the same method and arguments."""

    def __init__(self, *, lam: float = 1.0, **kwargs: Any) -> None:
        super().__init__(DittoServer(lam), **kwargs)


class PerFedAvg(GlobalModelStrategy):
    """``strategies.PerFedAvg`` for the Message API: the same method and arguments."""

    def __init__(self, *, alpha: float = 0.01, **kwargs: Any) -> None:
        super().__init__(PerFedAvgServer(alpha), **kwargs)


class PFedMe(GlobalModelStrategy):
    """``strategies.PFedMe`` for the Message API: the same method and arguments."""

    def __init__(self, *, beta: float = 1.0, lam: float = 15.0, personal_lr: float = 0.01, inner_steps: int = 5,
                 **kwargs: Any) -> None:
        super().__init__(PFedMeServer(beta, lam, personal_lr, inner_steps), **kwargs)


class APFL(GlobalModelStrategy):
    """``strategies.APFL`` for the Message API: the same method and arguments."""

    def __init__(self, *, alpha_init: float = 0.5, alpha_lr: float = 0.02, **kwargs: Any) -> None:
        super().__init__(APFLServer(alpha_init, alpha_lr), **kwargs)
