"""IGFL for the legacy Flower API."""

from __future__ import annotations

from typing import Any

from .global_model import GlobalModelStrategy
from .igfl_server import IGFLServer


class IGFL(GlobalModelStrategy):
    """IGFL (Huang, Shang et al.): one global model; clients run IGFL-C (Algorithm 2) and the
    server aggregates their deltas with attention (AFL, Algorithm 3).

    ``attention``: ``"self"``, ``"global"``, ``"time"``, or ``None`` (plain mean of the deltas,
    IGFL-C alone); ``client_correction=False``: clients run plain local SGD (IGFL-S alone).
    Needs ``initial_parameters``; everything else is Flower's FedAvg (sampling, evaluation).
    """

    def __init__(self, *, attention: str | None = "self", client_correction: bool = True, **kwargs: Any) -> None:
        super().__init__(IGFLServer(attention, client_correction), **kwargs)
