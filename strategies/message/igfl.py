"""IGFL for the Message API (``@app.main()`` + ``strategy.start``)."""

from __future__ import annotations

from functools import partial
from typing import Any, Iterable

from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from ..igfl_server import IGFLServer
from ..personalized import check_update
from .personalized import collect_train_replies


class IGFL(FedAvg):
    """IGFL (Huang, Shang et al.): one global model; clients run IGFL-C (Algorithm 2) and the
    server aggregates their deltas with attention (AFL, Algorithm 3).

    ``attention``: ``"self"``, ``"global"``, ``"time"``, or ``None`` for the plain mean of the
    deltas (IGFL-C alone); ``client_correction=False`` makes the clients run plain local SGD
    (IGFL-S alone). Sampling and federated evaluation of the global model are Flower's FedAvg's
    (its keyword arguments pass through). Clients read ``igfl-correction``, ``igfl-participants``
    and ``igfl-global-delta`` (float32 bytes of ``Δw_ps``) from the training config.
    """

    def __init__(self, *, attention: str | None = "self", client_correction: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.igfl = IGFLServer(attention, client_correction)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        named = {k: v.numpy() for k, v in arrays.items()}
        self.igfl.initialize(named)
        self.igfl.begin_round(list(named.values()))
        messages = list(super().configure_train(server_round, arrays, config, grid))
        extras = self.igfl.instructions(len(messages))
        for msg in messages:  # FedAvg gives every message the same config record
            for key, value in extras.items():
                msg.content[self.configrecord_key][key] = value
        return messages

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        layout = self.igfl.layout
        batch = collect_train_replies(replies, server_round, partial(check_update, layout))
        if not batch.ids:
            return None, MetricRecord(batch.metrics_dict())
        new = self.igfl.aggregate(batch.ids, batch.vectors)
        arrays = ArrayRecord({name: Array(a) for name, a in zip(layout.names, layout.to_numpy_list(new))})  # type: ignore[union-attr]
        return arrays, MetricRecord(batch.metrics_dict())
