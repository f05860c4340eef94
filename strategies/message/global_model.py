"""Message-API base for methods that train one global model on Flower's FedAvg with extra
server state (IGFL, SCAFFOLD): FedAvg samples and evaluates, a ``GlobalServer`` aggregates."""

from __future__ import annotations

from functools import partial
from typing import Any, Iterable

from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from ..global_server import GlobalServer
from ..personalized import check_update
from .personalized import collect_train_replies


class GlobalModelStrategy(FedAvg):
    """Flower's FedAvg with ``server``'s instructions added to every training message and its
    aggregation in place of the weighted mean. A client's extra bytes come back in a
    ConfigRecord of its reply."""

    def __init__(self, server: GlobalServer, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.server = server

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        named = {k: v.numpy() for k, v in arrays.items()}
        self.server.initialize(named)
        self.server.begin_round(list(named.values()), len(list(grid.get_node_ids())))
        messages = list(super().configure_train(server_round, arrays, config, grid))
        extras = self.server.instructions(len(messages))
        for msg in messages:  # FedAvg gives every message the same config record
            for key, value in extras.items():
                msg.content[self.configrecord_key][key] = value
        return self._personalize(messages, training=True)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        extras = self.server.evaluation_config()
        return self._personalize(list(super().configure_evaluate(server_round, arrays, ConfigRecord({**config, **extras}), grid)),
                                 training=False)

    def _personalize(self, messages: list[Message], training: bool) -> list[Message]:
        """Give each node the model ``server.client_model`` has for it, where it has one (in a
        content of its own: FedAvg's messages share one)."""
        layout = self.server.layout
        for msg in messages:
            own = self.server.client_model(msg.metadata.dst_node_id, training)
            if own is not None:
                content = RecordDict(dict(msg.content.items()))
                content[self.arrayrecord_key] = ArrayRecord(
                    {name: Array(a) for name, a in zip(layout.names, layout.to_numpy_list(own))})  # type: ignore[union-attr]
                msg.content = content
        return messages

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        layout = self.server.layout
        batch = collect_train_replies(replies, server_round, partial(check_update, layout), self.server.check_payload)
        if not batch.ids:
            return None, MetricRecord(batch.metrics_dict())
        new = self.server.aggregate(batch.ids, batch.vectors, batch.payloads, [n for n, _ in batch.metrics])
        arrays = ArrayRecord({name: Array(a) for name, a in zip(layout.names, layout.to_numpy_list(new))})  # type: ignore[union-attr]
        return arrays, MetricRecord(batch.metrics_dict())
