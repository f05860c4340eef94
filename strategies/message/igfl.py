"""IGFL for the Message API (``@app.main()`` + ``strategy.start``)."""

from __future__ import annotations

from typing import Any

from ..igfl_server import IGFLServer
from .global_model import GlobalModelStrategy


class IGFL(GlobalModelStrategy):
    """IGFL (Huang, Shang et al.): one global model; clients run IGFL-C (Algorithm 2) and the
    server aggregates their deltas with attention (AFL, Algorithm 3).

    ``attention``: ``"self"``, ``"global"``, ``"time"``, or ``None`` for the plain mean of the
    deltas (IGFL-C alone); ``client_correction=False`` makes the clients run plain local SGD
    (IGFL-S alone). Sampling and federated evaluation of the global model are Flower's FedAvg's
    (its keyword arguments pass through). Clients read ``igfl-correction``, ``igfl-participants``
    and ``igfl-global-delta`` (float32 bytes of ``Δw_ps``) from the training config.
    """

    def __init__(self, *, attention: str | None = "self", client_correction: bool = True, **kwargs: Any) -> None:
        super().__init__(IGFLServer(attention, client_correction), **kwargs)
