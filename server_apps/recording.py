"""Wrappers that record any strategy's per-round metrics and thin out evaluation rounds.

They delegate every call to the wrapped strategy, so they work the same for our
strategies and Flower's own.
"""

from __future__ import annotations

import time
from logging import INFO
from typing import Any, Iterable

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common import Parameters, parameters_to_ndarrays
from flwr.common.logger import log
from flwr.server.strategy import Strategy as LegacyStrategy
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy as MessageStrategy

from flower_pfl.results import RunRecorder
from flower_pfl.sampling import Sampler

from .checkpointing import Checkpointer
from .seeded import SampledGrid, in_rank_order, node_id


def _plain(metrics: Any) -> dict[str, Any]:
    """A client's numeric metrics as JSON values (lists and bytes are left out)."""
    return {k: v for k, v in dict(metrics).items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


class _Schedule:
    """Evaluation rounds, checkpoints and the round offset of a resumed run (Flower counts rounds
    from 1 again; the wrapped strategy, the recorder and checkpoints see the run's own rounds)."""

    def __init__(self, recorder: RunRecorder, eval_every: int, checkpointer: Checkpointer | None, offset: int) -> None:
        self.recorder, self.eval_every, self.checkpointer, self.offset = recorder, eval_every, checkpointer, offset

    def evaluate_now(self, server_round: int) -> bool:
        return server_round % self.eval_every == 0 or server_round == self.recorder.num_rounds or server_round == 1

    def before_round(self, server_round: int, arrays: Any) -> None:
        """Checkpoint the state after the previous round when one is due (not the one resumed from)."""
        done = server_round - 1
        if self.checkpointer is not None and done > self.offset and self.checkpointer.due(done):
            self.checkpointer.save(done, arrays)


class RecordedStrategy(MessageStrategy, _Schedule):
    """Message-API wrapper. Replies reach the wrapped strategy in rank order; with
    ``clients_per_round`` (Flower's own strategies) the round's participants are drawn by
    ``sampler``, not by Flower's sampling."""

    def __init__(self, inner: MessageStrategy, recorder: RunRecorder, eval_every: int, sampler: Sampler,
                 clients_per_round: int | None = None, checkpointer: Checkpointer | None = None, offset: int = 0) -> None:
        _Schedule.__init__(self, recorder, eval_every, checkpointer, offset)
        self.inner, self.sampler, self.clients_per_round = inner, sampler, clients_per_round
        self.arrays: dict[str, Any] | None = None  # the global arrays Flower's loop holds

    def summary(self) -> None:
        self.inner.summary()

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        server_round += self.offset
        self.arrays = {k: v.numpy() for k, v in arrays.items()}
        self.before_round(server_round, self.arrays)
        if self.clients_per_round is not None:
            while len(nodes := list(grid.get_node_ids())) < self.clients_per_round:  # as Flower's sampling waits
                log(INFO, "Waiting for nodes: %d connected, %d needed", len(nodes), self.clients_per_round)
                time.sleep(1)
            grid = SampledGrid(grid, self.sampler.sample(nodes, self.clients_per_round))  # type: ignore[assignment]
        return self.inner.configure_train(server_round, arrays, config, grid)

    def _ordered(self, replies: Iterable[Message]) -> list[Message]:
        return in_rank_order(self.sampler, replies, lambda msg: msg.metadata.src_node_id)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        server_round += self.offset
        arrays, metrics = self.inner.aggregate_train(server_round, self._ordered(replies))
        if arrays is not None:
            self.arrays = {k: v.numpy() for k, v in arrays.items()}
        self.recorder.on_train(server_round, dict(metrics or {}))
        return arrays, metrics

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        server_round += self.offset
        return self.inner.configure_evaluate(server_round, arrays, config, grid) if self.evaluate_now(server_round) else []

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        server_round += self.offset
        replies = self._ordered(replies)
        self.recorder.on_client_evaluations(server_round, [
            {"node-id": msg.metadata.src_node_id, **_plain(next(iter(msg.content.metric_records.values())))}
            for msg in replies if not msg.has_error() and msg.content.metric_records])
        metrics = self.inner.aggregate_evaluate(server_round, replies)
        if metrics:
            self.recorder.on_evaluate(server_round, dict(metrics))
        return metrics


class RecordedLegacyStrategy(LegacyStrategy, _Schedule):
    """Legacy-API wrapper. Results reach the wrapped strategy in rank order (the legacy server
    collects them as its threads finish); sampling is the client manager's (``SeededClientManager``).
    ``initial_parameters`` (a resumed run's global arrays) replace the wrapped strategy's."""

    def __init__(self, inner: LegacyStrategy, recorder: RunRecorder, eval_every: int, sampler: Sampler,
                 checkpointer: Checkpointer | None = None, offset: int = 0, initial_parameters: Parameters | None = None) -> None:
        _Schedule.__init__(self, recorder, eval_every, checkpointer, offset)
        self.inner, self.sampler, self.initial = inner, sampler, initial_parameters
        self.arrays: list[Any] | None = None

    def _ordered(self, results: Any) -> list[Any]:
        return in_rank_order(self.sampler, results, lambda pair: node_id(pair[0].cid))

    def named(self) -> dict[str, Any] | None:
        """The global arrays Flower's loop holds, by position (legacy parameters carry no names)."""
        return None if self.arrays is None else {str(i): a for i, a in enumerate(self.arrays)}

    def __repr__(self) -> str:
        return repr(self.inner)

    def initialize_parameters(self, client_manager: Any) -> Any:
        return self.initial if self.initial is not None else self.inner.initialize_parameters(client_manager)

    def configure_fit(self, server_round: int, parameters: Any, client_manager: Any) -> Any:
        server_round += self.offset
        self.arrays = parameters_to_ndarrays(parameters) if parameters is not None else None
        self.before_round(server_round, self.named())
        return self.inner.configure_fit(server_round, parameters, client_manager)

    def aggregate_fit(self, server_round: int, results: Any, failures: Any) -> Any:
        server_round += self.offset
        params, metrics = self.inner.aggregate_fit(server_round, self._ordered(results), failures)
        if params is not None:
            self.arrays = parameters_to_ndarrays(params)
        self.recorder.on_train(server_round, metrics or {})
        return params, metrics

    def configure_evaluate(self, server_round: int, parameters: Any, client_manager: Any) -> Any:
        server_round += self.offset
        return self.inner.configure_evaluate(server_round, parameters, client_manager) if self.evaluate_now(server_round) else []

    def aggregate_evaluate(self, server_round: int, results: Any, failures: Any) -> Any:
        server_round += self.offset
        results = self._ordered(results)
        self.recorder.on_client_evaluations(server_round, [
            {"node-id": int(proxy.cid), "loss": res.loss, "num-examples": res.num_examples, **_plain(res.metrics)}
            for proxy, res in results])
        loss, metrics = self.inner.aggregate_evaluate(server_round, results, failures)
        if metrics:
            self.recorder.on_evaluate(server_round, metrics)
        return loss, metrics

    def evaluate(self, server_round: int, parameters: Any) -> Any:
        return self.inner.evaluate(server_round + self.offset, parameters)
