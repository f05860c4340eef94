"""Message-API base class for personalized strategies (``flwr.serverapp.strategy.Strategy``)."""

from __future__ import annotations

import time
from logging import INFO
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from flower_pfl.methods import ServerRule
from flower_pfl.methods.base import evaluation_config

from ..metrics import NUM_EXAMPLES, personalized_evaluate_metrics
from ..personalized import PersonalizedServer, TrainReplies, UpdateRejected, checked_payload, log_rejected, make_rule


def collect_train_replies(
    replies: Iterable[Message], server_round: int, check: Callable[[list[np.ndarray], list[str]], torch.Tensor],
    check_payload: Callable[[Mapping[str, Any]], Any] | None = None,
) -> TrainReplies:
    """Check every training reply: one ArrayRecord whose arrays pass ``check``, one MetricRecord
    with ``num-examples``, and, if ``check_payload`` is given, ConfigRecords (a client's extra
    bytes) that pass it. Failed and rejected clients are logged and left out."""
    batch = TrainReplies()
    for msg in replies:
        node_id = msg.metadata.src_node_id
        if msg.has_error():
            batch.failed += 1
            log(INFO, "round %s: node %s failed (%s); its stored model is unchanged", server_round, node_id, msg.error.reason)
            continue
        try:
            content = msg.content
            if len(content.array_records) != 1 or len(content.metric_records) != 1:
                raise UpdateRejected("a reply must hold exactly one ArrayRecord and one MetricRecord")
            record = next(iter(content.array_records.values()))
            metrics = dict(next(iter(content.metric_records.values())))
            if NUM_EXAMPLES not in metrics:
                raise UpdateRejected(f"MetricRecord lacks '{NUM_EXAMPLES}'")
            vector = check([a.numpy() for a in record.values()], list(record.keys()))
            if check_payload is not None:
                extras = {k: v for rec in content.config_records.values() for k, v in rec.items()}
                batch.payloads.append(checked_payload(check_payload, extras))
        except UpdateRejected as err:
            batch.rejected += 1
            log_rejected(node_id, server_round, str(err))
            continue
        batch.ids.append(node_id)
        batch.vectors.append(vector)
        batch.metrics.append((int(metrics[NUM_EXAMPLES]), metrics))
    return batch


class PersonalizedStrategy(Strategy):
    """Keeps one model per node on the server; the ``rule`` decides what each participant gets.

    ``start(grid=..., initial_arrays=..., train_config=...)`` works as for Flower's
    own strategies: ``initial_arrays`` is every client's starting model and
    ``train_config`` (e.g. ``lr``, ``local-steps``, ``batch-size``) is sent to every
    participant together with the rule's own solver settings. ``aggregate_train``
    returns no global arrays: the personalized models stay in ``self.server.store``.
    """

    #: the method's rule; subclasses set it, and their keyword arguments not listed here go to it
    rule_class: type | None = None

    def __init__(
        self,
        rule: ServerRule | None = None,
        *,
        clients_per_round: int = 10,
        min_available_nodes: int = 2,
        fraction_evaluate: float = 1.0,
        seed: int = 0,
        device: str | torch.device = "cpu",
        arrayrecord_key: str = "arrays",
        configrecord_key: str = "config",
        **rule_kwargs: Any,
    ) -> None:
        self.server = PersonalizedServer(make_rule(self.rule_class, rule, rule_kwargs), clients_per_round, seed=seed, device=device)
        self.min_available_nodes = min_available_nodes
        self.fraction_evaluate = fraction_evaluate
        self.arrayrecord_key = arrayrecord_key
        self.configrecord_key = configrecord_key

    @property
    def rule(self) -> ServerRule:
        return self.server.rule

    def summary(self) -> None:
        log(INFO, "\t├──> Method: %s", self.rule)
        log(INFO, "\t├──> Clients per round: %s", self.server.clients_per_round)
        log(INFO, "\t└──> Evaluation: fraction %.2f of nodes, each on its own model", self.fraction_evaluate)

    def _nodes(self, grid: Grid) -> list[int]:
        while len(nodes := list(grid.get_node_ids())) < self.min_available_nodes:
            log(INFO, "Waiting for nodes: %d connected, %d needed", len(nodes), self.min_available_nodes)
            time.sleep(1)
        return nodes

    def _message(self, node_id: int, model: torch.Tensor, config: ConfigRecord, kind: str) -> Message:
        arrays = ArrayRecord({k: Array(v) for k, v in self.server.to_named_arrays(model).items()})
        return Message(content=RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config}),
                       message_type=kind, dst_node_id=node_id)

    def _initialize(self, arrays: ArrayRecord) -> None:
        if not self.server.initialized:
            self.server.initialize({k: v.numpy() for k, v in arrays.items()})

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        self._initialize(arrays)
        plan = self.server.plan_training(self._nodes(grid))
        log(INFO, "configure_train: %d nodes train, %d of them on a new personalized model",
            len(plan), min(self.server.clients_per_round, len(plan)))
        return [self._message(ins.client_id, ins.model, ConfigRecord({**config, **ins.config, "server-round": server_round}),
                              MessageType.TRAIN) for ins in plan]

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        batch = collect_train_replies(replies, server_round, self.server.check_update)
        self.server.commit(batch.ids, batch.vectors)
        return None, MetricRecord(batch.metrics_dict())

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        if self.fraction_evaluate <= 0:
            return []
        self._initialize(arrays)
        node_ids = self.server.sample_fraction(self._nodes(grid), self.fraction_evaluate)
        cfg = ConfigRecord({**config, **evaluation_config(self.rule), "server-round": server_round})
        models = self.server.stored_models(node_ids)
        return [self._message(nid, models[i], cfg, MessageType.EVALUATE) for i, nid in enumerate(node_ids)]

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        good = [msg.content for msg in replies if not msg.has_error() and msg.content.metric_records]
        return personalized_evaluate_metrics(good) if good else None
