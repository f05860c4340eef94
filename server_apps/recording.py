"""Wrappers that record any strategy's per-round metrics and thin out evaluation rounds.

They delegate every call to the wrapped strategy, so they work the same for our
strategies and Flower's own.
"""

from __future__ import annotations

from typing import Any, Iterable

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.server.strategy import Strategy as LegacyStrategy
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy as MessageStrategy

from flower_pfl.results import RunRecorder
from flower_pfl.sampling import Sampler

from .seeded import SampledGrid, in_rank_order, node_id


def _plain(metrics: Any) -> dict[str, Any]:
    """A client's numeric metrics as JSON values (lists and bytes are left out)."""
    return {k: v for k, v in dict(metrics).items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


class _Schedule:
    def __init__(self, recorder: RunRecorder, eval_every: int) -> None:
        self.recorder, self.eval_every = recorder, eval_every

    def evaluate_now(self, server_round: int) -> bool:
        return server_round % self.eval_every == 0 or server_round == self.recorder.num_rounds or server_round == 1


class RecordedStrategy(MessageStrategy, _Schedule):
    """Message-API wrapper. Replies reach the wrapped strategy in rank order; with
    ``clients_per_round`` (Flower's own strategies) the round's participants are drawn by
    ``sampler``, not by Flower's sampling."""

    def __init__(self, inner: MessageStrategy, recorder: RunRecorder, eval_every: int, sampler: Sampler,
                 clients_per_round: int | None = None) -> None:
        _Schedule.__init__(self, recorder, eval_every)
        self.inner, self.sampler, self.clients_per_round = inner, sampler, clients_per_round

    def summary(self) -> None:
        self.inner.summary()

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        if self.clients_per_round is not None:
            grid = SampledGrid(grid, self.sampler.sample(grid.get_node_ids(), self.clients_per_round))  # type: ignore[assignment]
        return self.inner.configure_train(server_round, arrays, config, grid)

    def _ordered(self, replies: Iterable[Message]) -> list[Message]:
        return in_rank_order(self.sampler, replies, lambda msg: msg.metadata.src_node_id)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        arrays, metrics = self.inner.aggregate_train(server_round, self._ordered(replies))
        self.recorder.on_train(server_round, dict(metrics or {}))
        return arrays, metrics

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        return self.inner.configure_evaluate(server_round, arrays, config, grid) if self.evaluate_now(server_round) else []

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
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
    collects them as its threads finish); sampling is the client manager's (``SeededClientManager``)."""

    def __init__(self, inner: LegacyStrategy, recorder: RunRecorder, eval_every: int, sampler: Sampler) -> None:
        _Schedule.__init__(self, recorder, eval_every)
        self.inner, self.sampler = inner, sampler

    def _ordered(self, results: Any) -> list[Any]:
        return in_rank_order(self.sampler, results, lambda pair: node_id(pair[0].cid))

    def __repr__(self) -> str:
        return repr(self.inner)

    def initialize_parameters(self, client_manager: Any) -> Any:
        return self.inner.initialize_parameters(client_manager)

    def configure_fit(self, server_round: int, parameters: Any, client_manager: Any) -> Any:
        return self.inner.configure_fit(server_round, parameters, client_manager)

    def aggregate_fit(self, server_round: int, results: Any, failures: Any) -> Any:
        params, metrics = self.inner.aggregate_fit(server_round, self._ordered(results), failures)
        self.recorder.on_train(server_round, metrics or {})
        return params, metrics

    def configure_evaluate(self, server_round: int, parameters: Any, client_manager: Any) -> Any:
        return self.inner.configure_evaluate(server_round, parameters, client_manager) if self.evaluate_now(server_round) else []

    def aggregate_evaluate(self, server_round: int, results: Any, failures: Any) -> Any:
        results = self._ordered(results)
        self.recorder.on_client_evaluations(server_round, [
            {"node-id": int(proxy.cid), "loss": res.loss, "num-examples": res.num_examples, **_plain(res.metrics)}
            for proxy, res in results])
        loss, metrics = self.inner.aggregate_evaluate(server_round, results, failures)
        if metrics:
            self.recorder.on_evaluate(server_round, metrics)
        return loss, metrics

    def evaluate(self, server_round: int, parameters: Any) -> Any:
        return self.inner.evaluate(server_round, parameters)
