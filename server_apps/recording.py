"""Wrappers that record any strategy's per-round metrics and thin out evaluation rounds.

They delegate every call to the wrapped strategy, so they work the same for our
strategies and Flower's own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from contextlib import nullcontext
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common import EvaluateIns, Parameters, parameters_to_ndarrays
from flwr.server.strategy import Strategy as LegacyStrategy
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy as MessageStrategy

from flower_pfl.engine.client_metrics import NEW_CLIENT_ROW
from flower_pfl.engine.new_clients import NewClients
from flower_pfl.engine.reply_checks import UpdateRejected, check_evaluation
from flower_pfl.engine.sampling import Sampler
from flower_pfl.engine.wording import agreeing, counted
from flower_pfl.run.cost import BYTES_DOWN, BYTES_UP, MEASURED, PEAK_MEMORY, peak_rss_mib, reply_cost, traffic_metrics
from flower_pfl.run.results import RunFailed, RunRecorder
from server_apps.checkpoints import Checkpointer
from server_apps.guard import ReplyGuard
from server_apps.seeded import SampledGrid, SeededClientManager, in_rank_order, node_id
from strategies.aggregated_metrics import ACCURACY, PersonalizedMetrics
from strategies.arrays import record_numpy
from strategies.failures import RAY_ACTOR_LOSSES, NodeFailures
from strategies.legacy import record_failures
from strategies.nodes import NodeWatch, split_replies
from strategies.records import merged, records
from strategies.traffic import content_bytes, legacy_bytes


def _usable(metrics: Any) -> dict[str, Any] | None:
    """A client's evaluation metrics as JSON numbers (its node's memory left out: the round's row has the
    largest), or ``None`` when they fail ``check_evaluation`` (the strategy logs why)."""
    try:
        checked = check_evaluation(dict(metrics), ACCURACY)
    except UpdateRejected:
        return None
    return {k: v for k, v in checked.items() if k not in MEASURED}


def flower_cost(metrics: Mapping[str, Any], down: Sequence[int], up: Sequence[int],
                replies: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Flower's own strategy's round ``metrics`` with the round's cost (``flower_pfl.run.cost``): the bytes
    ``down`` and ``up`` of each message, the server's peak memory, and the clients' training time and peak
    memory of ``replies``' metrics, which its sample-weighted means would get wrong."""
    return {**metrics, **reply_cost(replies), **traffic_metrics(down, up), PEAK_MEMORY: peak_rss_mib()}


class WireMeter:
    """The bytes that crossed to and from the nodes for one message type between ``start`` and ``read``, where
    the grid counts them (``server_apps.client_grid.ClientGrid.wire``: a node's message holds several clients')."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._wire: Counter[str] | None = None
        self._before: Counter[str] = Counter()

    def start(self, grid: Any) -> None:
        wire = getattr(grid, "wire", None)
        self._wire = wire if isinstance(wire, Counter) else None
        self._before = Counter(self._wire or {})

    def read(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """``metrics`` with ``bytes-down`` and ``bytes-up`` as the grid counted them (unchanged where it does not)."""
        if self._wire is None:
            return metrics
        down, up = f"{self.kind} down", f"{self.kind} up"
        return {**metrics, BYTES_DOWN: float(self._wire[down] - self._before[down]),
                BYTES_UP: float(self._wire[up] - self._before[up])}


def _reply_metrics(replies: Iterable[Message]) -> list[dict[str, Any]]:
    return [merged(msg.content, MetricRecord)
            for msg in replies if not msg.has_error()]


class _Schedule:
    """Evaluation rounds, checkpoints, the round offset of a resumed run (Flower counts rounds
    from 1 again; the wrapped strategy, the recorder and checkpoints see the run's own rounds),
    and the run's health: more than ``max_idle_rounds`` of its rounds without an accepted update
    stop it with ``RunFailed``."""

    def __init__(self, recorder: RunRecorder, eval_every: int, checkpointer: Checkpointer | None, offset: int,
                 max_idle_rounds: float = 1.0, failures: NodeFailures | None = None, new: NewClients | None = None) -> None:
        self.recorder, self.eval_every, self.checkpointer, self.offset = recorder, eval_every, checkpointer, offset
        self.max_idle_rounds, self.failures = max_idle_rounds, failures
        #: the clients that never train (where Flower's own strategy runs, they are left out here)
        self.new = new or NewClients(Sampler())

    def client_row(self, client: Any, metrics: dict[str, Any]) -> dict[str, Any]:
        """A client's row of ``clients.jsonl``: its id and metrics, and ``new-client`` for one that never trains."""
        return {"node-id": client, **metrics, **({NEW_CLIENT_ROW: True} if self.new.is_new(client) else {})}

    @staticmethod
    def new_figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
        """The figures of the new clients' ``rows``, apart from the participating clients' (``PersonalizedMetrics``)."""
        return PersonalizedMetrics().new_clients(rows)

    def check_losses(self, server_round: int) -> None:
        """Stop the run when the nodes lost (``strategies.failures``) leave too few clients for an evaluated
        round that counts (``flower_pfl.run.results.Coverage``): the rounds left could not change its figures."""
        lost, coverage = (self.failures.lost if self.failures is not None else {}), self.recorder.coverage
        left = coverage.clients - len(lost)
        if not lost or not coverage.clients or left >= coverage.evaluated:
            return
        causes = sorted({s.cause for s in lost.values()})
        since, shown, n = min(s.since for s in lost.values()), ", ".join(causes), len(lost)
        noun = self.failures.noun if self.failures is not None else "node"
        hosts = self.failures.hosts if self.failures is not None else {}
        whose, them = f"{n} of the federation's {counted(coverage.clients, noun)}", agreeing(n, f"that {noun}", f"those {noun}s")
        if nodes := sorted({hosts[c] for c in lost if c in hosts}):  # the ids are clients: a Ray worker's loss is their nodes'
            actors = (f"{len(nodes)} of the federation's {counted(len(set(hosts.values())), 'node')}, hosting {n} of its "
                      f"{counted(coverage.clients, 'client')},")
            them = agreeing(len(nodes), "that node", "those nodes")
        else:
            actors = whose
        short = (f"the {counted(left, noun)} left cannot make an evaluated round that counts (min-evaluated-share "
                 f"{coverage.share:g} asks for {coverage.evaluated})")
        resume = f"continue from the last checkpoint with resume-from = '{self.recorder.out_dir}'"
        if RAY_ACTOR_LOSSES.issuperset(causes):  # a simulation's virtual nodes stay: their actors died with their worker
            reason = (f"the Ray worker behind the actors of {actors} is gone since round {since} ({shown}): the actors "
                      f"died with it and are not replaced during a run, so every message to {them} fails, and {short}. "
                      "Ray's logs say why the worker died (out of memory is the usual cause: fewer actors per machine, "
                      "with a larger client-resources-num-cpus, or more memory for the worker); then " + resume)
        else:
            reason = (f"{whose} lost since round {since} ({shown}): {short}. A lost SuperNode is not replaced during a "
                      f"run: bring the nodes back and {resume}")
        self.recorder.fail(reason)
        raise RunFailed(f"round {server_round}: {reason}")

    def after_train(self, server_round: int, metrics: dict[str, Any]) -> None:
        self.recorder.on_train(server_round, metrics)
        self.check_losses(server_round)
        idle, total = self.recorder.idle_rounds, self.recorder.num_rounds
        if idle > self.max_idle_rounds * total:
            if metrics.get("clients-failed", 0) and not metrics.get("clients-rejected", 0) and self.failures is not None:
                why = f"their clients failed ({'; '.join(self.failures.report())}; full reasons in failures.log)"
            else:
                why = "every update failed or was refused (the warnings above say why, e.g. a learning rate that makes training diverge)"
            reason = (f"{idle} of the run's {total} rounds accepted no client update, more than max-idle-rounds = "
                      f"{self.max_idle_rounds:g} of them: {why}")
            self.recorder.fail(reason)
            raise RunFailed(f"round {server_round}: {reason}")

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
                 clients_per_round: int | None = None, checkpointer: Checkpointer | None = None, offset: int = 0,
                 guard: ReplyGuard | None = None, max_idle_rounds: float = 1.0, nodes: NodeWatch | None = None,
                 new: NewClients | None = None) -> None:
        self.guard, self.nodes = guard, nodes or NodeWatch()
        _Schedule.__init__(self, recorder, eval_every, checkpointer, offset, max_idle_rounds, self.nodes.failures, new)
        self.inner, self.sampler, self.clients_per_round = inner, sampler, clients_per_round
        self.arrays: dict[str, Any] | None = None  # the global arrays Flower's loop holds
        self._outbox: list[Message] = []
        self._meters = {kind: WireMeter(kind) for kind in (MessageType.TRAIN, MessageType.EVALUATE)}

    def summary(self) -> None:
        self.inner.summary()

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        server_round += self.offset
        self.arrays = record_numpy(arrays)
        self.before_round(server_round, self.arrays)
        if self.clients_per_round is not None:
            nodes = self.nodes.wait(grid, self.clients_per_round)  # as Flower's sampling waits, but not for ever
            grid = SampledGrid(grid, self.sampler.sample(self.new.trainers(nodes), self.clients_per_round))  # type: ignore[assignment,arg-type]
        self._outbox = list(self.inner.configure_train(server_round, arrays, config, grid))
        self._meters[MessageType.TRAIN].start(grid)
        return self._outbox

    def _cost(self, kind: str, metrics: Mapping[str, Any], received: list[Message], aggregated: list[Message]) -> dict[str, Any]:
        """The round's ``metrics`` with its cost: measured here for Flower's own strategy (ours measure theirs;
        the clients' time and memory those of the ``aggregated`` replies), the bytes on the wire from the grid
        where it counts them (``WireMeter``)."""
        out = dict(metrics)
        if self.guard is not None:
            sizes: dict[int, int] = {}  # a record the instructions share (the global model) is measured once
            out = flower_cost(out, [content_bytes(m.content, sizes) for m in self._outbox],
                              [content_bytes(m.content) for m in received if not m.has_error()], _reply_metrics(aggregated))
        return self._meters[kind].read(out)

    def _ordered(self, replies: Iterable[Message]) -> list[Message]:
        return in_rank_order(self.sampler, replies, lambda msg: msg.metadata.src_node_id)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        server_round += self.offset
        counts: dict[str, float] = {}
        received = replies = list(replies)
        if self.guard is not None and self.arrays is not None:  # Flower's own strategy: check its replies first
            replies, counts = self.guard.messages(server_round, replies, self.arrays, self._outbox, self.nodes.failures)
        replies = self._ordered(replies)
        arrays, metrics = self.inner.aggregate_train(server_round, replies) if replies or self.guard is None else (None, None)
        if arrays is not None:
            self.arrays = record_numpy(arrays)
        row = self._cost(MessageType.TRAIN, dict(metrics or {}), received, replies)
        self.after_train(server_round, {**row, **counts})
        return arrays, None if metrics is None else MetricRecord(row)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        server_round += self.offset
        if not self.evaluate_now(server_round):
            self._outbox = []  # Flower's loop still calls aggregate_evaluate: no instruction went out, none is missing
            return []
        if self.guard is not None and self.nodes.failures.lost:  # Flower's own strategy: not the lost nodes
            grid = SampledGrid(grid, self.nodes.alive(grid.get_node_ids()))  # type: ignore[assignment]
        self._outbox = list(self.inner.configure_evaluate(server_round, arrays, config, grid))
        if self.guard is not None and self.new:  # Flower's own strategy: its new clients told so
            self._outbox = [self._told_new(msg) if self.new.is_new(msg.metadata.dst_node_id) else msg for msg in self._outbox]
        self._meters[MessageType.EVALUATE].start(grid)
        return self._outbox

    def _told_new(self, msg: Message) -> Message:
        """``msg`` with the entries of a new client's instruction (``NewClients.settings``) in its config."""
        content = RecordDict({key: record for key, record in msg.content.items()})
        for key, record in records(msg.content, ConfigRecord).items():
            content[key] = ConfigRecord({**record, **self.new.settings()})
        return Message(content=content, dst_node_id=msg.metadata.dst_node_id, message_type=msg.metadata.message_type)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        server_round += self.offset
        replies = list(replies)
        if self.guard is not None:  # Flower's own strategy: its failed nodes counted (ours count their own)
            good, _ = split_replies(server_round, replies, self._outbox, self.nodes.failures)
            replies = [msg for _, msg in good]
        received = replies
        replies = self._ordered(replies)
        usable = {id(msg): row for msg in replies if not msg.has_error() and (found := records(msg.content, MetricRecord))
                  and (row := _usable(next(iter(found.values())))) is not None}
        self.recorder.on_client_evaluations(server_round, [
            self.client_row(msg.metadata.src_node_id, usable[id(msg)]) for msg in replies if id(msg) in usable])
        new: dict[str, Any] = {}
        if self.guard is not None:  # Flower's own strategy stops at a reply it cannot aggregate, and counts new clients in
            replies = [msg for msg in replies if id(msg) in usable]
            new = self.new_figures([usable[id(msg)] for msg in replies if self.new.is_new(msg.metadata.src_node_id)])
            replies = [msg for msg in replies if not self.new.is_new(msg.metadata.src_node_id)]
        metrics = self.inner.aggregate_evaluate(server_round, replies) if replies else None
        if metrics or new:
            metrics = MetricRecord(self._cost(MessageType.EVALUATE, {**dict(metrics or {}), **new}, received, replies))
            self.recorder.on_evaluate(server_round, dict(metrics))
        self.check_losses(server_round)
        return metrics


class RecordedLegacyStrategy(LegacyStrategy, _Schedule):
    """Legacy-API wrapper. Results reach the wrapped strategy in rank order (the legacy server
    collects them as its threads finish); sampling is the client manager's (``SeededClientManager``).
    ``initial_parameters`` (a resumed run's global arrays) replace the wrapped strategy's."""

    def __init__(self, inner: LegacyStrategy, recorder: RunRecorder, eval_every: int, sampler: Sampler,
                 checkpointer: Checkpointer | None = None, offset: int = 0, initial_parameters: Parameters | None = None,
                 guard: ReplyGuard | None = None, max_idle_rounds: float = 1.0, failures: NodeFailures | None = None,
                 new: NewClients | None = None) -> None:
        _Schedule.__init__(self, recorder, eval_every, checkpointer, offset, max_idle_rounds, failures or NodeFailures(0), new)
        self.inner, self.sampler, self.initial, self.guard = inner, sampler, initial_parameters, guard
        self.arrays: list[Any] | None = None
        self._sent: list[int] = []  # Flower's own strategy: the bytes of each instruction of the last configure call

    def _measured(self, instructions: Any) -> Any:
        if self.guard is not None:
            instructions = list(instructions)
            self._sent = [legacy_bytes(ins.parameters, ins.config) for _, ins in instructions]
        return instructions

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
        with client_manager.drawing_trainers() if isinstance(client_manager, SeededClientManager) else nullcontext():
            return self._measured(self.inner.configure_fit(server_round, parameters, client_manager))

    def aggregate_fit(self, server_round: int, results: Any, failures: Any) -> Any:
        server_round += self.offset
        counts: dict[str, float] = {}
        up = [legacy_bytes(res.parameters, res.metrics, numbers=1) for _, res in results]
        if self.guard is not None and self.failures is not None:  # Flower's own: its failed clients counted (ours count theirs)
            record_failures(self.failures, server_round, failures, "train")
        if self.guard is not None and self.arrays is not None:  # Flower's own strategy: check its results first
            results, counts = self.guard.results(server_round, results, self.arrays, failures)
        results = self._ordered(results)
        params, metrics = self.inner.aggregate_fit(server_round, results, failures) if results or self.guard is None else (None, {})
        if params is not None:
            self.arrays = parameters_to_ndarrays(params)
        row = {**dict(metrics or {}), **counts}
        if self.guard is not None:  # Flower's own strategy: its round's cost (ours measure theirs)
            row = flower_cost(row, self._sent, up, [res.metrics for _, res in results])
        self.after_train(server_round, row)
        return params, metrics

    def configure_evaluate(self, server_round: int, parameters: Any, client_manager: Any) -> Any:
        server_round += self.offset
        if not self.evaluate_now(server_round):
            return []
        sent = self.inner.configure_evaluate(server_round, parameters, client_manager)
        if self.guard is not None and self.new:  # Flower's own strategy: its new clients told so
            sent = [(proxy, EvaluateIns(ins.parameters, {**ins.config, **self.new.settings()}) if self.new.is_new(node_id(proxy.cid))
                     else ins) for proxy, ins in sent]
        return self._measured(sent)

    def aggregate_evaluate(self, server_round: int, results: Any, failures: Any) -> Any:
        server_round += self.offset
        results = self._ordered(results)
        usable = {id(res): row for _, res in results
                  if (row := _usable({**res.metrics, "loss": res.loss, "num-examples": res.num_examples})) is not None}
        self.recorder.on_client_evaluations(server_round, [
            self.client_row(int(proxy.cid), usable[id(res)]) for proxy, res in results if id(res) in usable])
        new: dict[str, Any] = {}
        up = [legacy_bytes(None, res.metrics, numbers=2) for _, res in results]
        if self.guard is not None:  # Flower's own strategy stops at a result it cannot aggregate, and counts new clients in
            results = [(proxy, res) for proxy, res in results if id(res) in usable]
            new = self.new_figures([usable[id(res)] for proxy, res in results if self.new.is_new(node_id(proxy.cid))])
            results = [(proxy, res) for proxy, res in results if not self.new.is_new(node_id(proxy.cid))]
        loss, metrics = self.inner.aggregate_evaluate(server_round, results, failures) if results else (None, {})
        if metrics or new:  # the legacy API returns the loss beside the metrics
            row = {**({"loss": loss} if loss is not None else {}), **(metrics or {}), **new}
            if self.guard is not None:  # Flower's own strategy: its round's cost (ours measure theirs)
                row = flower_cost(row, self._sent, up, [res.metrics for _, res in results])
            self.recorder.on_evaluate(server_round, row)
        return loss, metrics

    def evaluate(self, server_round: int, parameters: Any) -> Any:
        return self.inner.evaluate(server_round + self.offset, parameters)
