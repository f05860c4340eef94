"""The Message-API strategy every method of this package runs on (``flwr.serverapp.strategy.Strategy``)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Iterable
from functools import partial
from logging import INFO, WARNING
from typing import Any, ClassVar, TypedDict

import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from flower_pfl.engine.client_algorithm import LOCAL_STEPS, LR, SERVER_ROUND
from flower_pfl.engine.composition import checked_evaluate_fn
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.engine.reply_checks import (
    MAX_MEDIAN_RATIO,
    MAX_UPDATE_RATIO,
    MAX_WEIGHT_RATIO,
    RawReply,
    ReplyBounds,
    RoundReplies,
    UpdateRejected,
    decoded,
    is_number,
)
from flower_pfl.engine.server_algorithm import Instruction, ServerAlgorithm
from flower_pfl.run.cost import PEAK_MEMORY, peak_rss_mib, reply_cost, traffic_metrics
from strategies.aggregated_metrics import (
    ACCURACY,
    IDENTITIES,
    NUM_EXAMPLES,
    PersonalizedMetrics,
    checked_groups,
    log_refused_evaluations,
    reply_counts,
    round_replies_metrics,
)
from strategies.arrays import array_numpy, array_record, numpy_array, numpy_record, record_numpy
from strategies.failures import LOST_AFTER
from strategies.final_results import compact_final_results, log_final_results
from strategies.nodes import NODE_WAIT_TIMEOUT, NodeWatch, query, split_replies
from strategies.per_method import SHARED_OPTION_DOCS, PerMethodDocs
from strategies.privacy import check_privacy_mechanisms
from strategies.ranks import MESSAGE_ADVICE, learn_ranks, prepare_draw, ranked_rows
from strategies.records import merged, records
from strategies.replies import log_trainers, receive_round
from strategies.tracking import StrategyTracking, TrackerArg
from strategies.traffic import content_bytes

MetricsFn = Callable[[list[RecordDict], str], MetricRecord]


class MessageOptions(TypedDict, total=False):
    """``MethodStrategy``'s options as keyword arguments of the method classes (``strategies.message.FedMCSA(...,
    **options)``), documented in ``MethodStrategy.OPTION_DOCS``."""

    clients_per_round: int | None
    fraction_train: float
    min_train_nodes: int
    min_available_nodes: int
    fraction_evaluate: float
    min_evaluate_nodes: int
    weighted_by_key: str
    train_metrics_aggr_fn: MetricsFn | None
    seed: int
    device: str | torch.device
    store_dir: str | None
    arrayrecord_key: str
    configrecord_key: str
    evaluate_metrics_aggr_fn: MetricsFn | None
    accuracy_key: str
    max_update_ratio: float
    max_weight_ratio: float
    max_median_ratio: float
    lr: float | None
    local_steps: int | None
    node_wait_timeout: float
    lost_node_rounds: int
    rank_key: str | None
    rank_query: bool
    tracker: TrackerArg
    tracker_dir: str


class MethodStrategy(PerMethodDocs, Strategy):
    """A method's server algorithm (``flower_pfl.engine.server_algorithm``) as a Message-API strategy.

    ``start(grid=..., initial_arrays=..., num_rounds=..., train_config=...)`` works as for Flower's
    own strategies: ``initial_arrays`` is every client's starting model (its names key the
    parameters) and ``train_config`` (e.g. ``lr``, ``local-steps``, ``batch-size``) goes to every
    participant together with the method's own client settings and ``server-round``.
    ``aggregate_train`` returns the new global model for methods that have one, else nothing
    (the personalized models stay in ``self.server.method.store``).
    """

    OPTION_DOCS: ClassVar[dict[str, str]] = {
        **SHARED_OPTION_DOCS,
        "clients_per_round": "Clients that train each round (None: ``fraction_train`` of the connected nodes).",
        "fraction_train": "Fraction of the connected nodes that train when ``clients_per_round`` is None.",
        "min_train_nodes": "Least number of nodes that train when ``fraction_train`` is used.",
        "min_available_nodes": "Nodes to wait for before a round starts (at most ``node_wait_timeout`` seconds).",
        "min_evaluate_nodes": "Least number of nodes that evaluate when ``fraction_evaluate`` < 1.",
        "weighted_by_key": "The MetricRecord key of a reply's sample count (weights aggregation and metrics).",
        "train_metrics_aggr_fn": "Aggregates the accepted training replies' records, as Flower's FedAvg's "
                                 "(default: every numeric metric's sample-weighted mean); reply counts are added.",
        "fraction_evaluate": "Fraction of the connected nodes that evaluate (each the model it would use); 0 turns evaluation off.",
        "arrayrecord_key": "Key of the ArrayRecord in messages.",
        "configrecord_key": "Key of the ConfigRecord in messages.",
        "evaluate_metrics_aggr_fn": "Aggregates the clients' evaluation MetricRecords, as Flower's FedAvg's (None: every "
                                    "numeric metric's sample-weighted mean under its own name); the personalized summary "
                                    "of ``accuracy_key`` (``strategies.aggregated_metrics.PersonalizedMetrics``) is added either way.",
        "max_weight_ratio": "Count a reply's ``num-examples`` at most this multiple of the lower median of the clients' first claims, and never more than its own client's first count (``flower_pfl.engine.reply_checks.WeightBook``); ``math.inf``: off.",
        "node_wait_timeout": "Seconds a round waits for ``min_available_nodes`` before it goes on with the nodes connected.",
        "lost_node_rounds": "A node that failed in this many consecutive rounds it was sent work is lost: named once, "
                            "with the round since which it fails and the error's name, and not sampled any more "
                            "(``strategies.failures``); 0: never. Every failure is still counted, one log line per node and cause.",
        "rank_key": "The MetricRecord key under which nodes report a stable rank (e.g. their partition id) that orders them "
                    "for sampling and aggregation, as node ids change from run to run; learned from the training and "
                    "evaluation replies that carry it (and the QUERY replies ``rank_query`` asks for). None: nodes are "
                    "ordered by node id.",
        "rank_query": "Before a draw, ask each node without a rank once for ``rank_key`` with a QUERY message. Only for a "
                      "ClientApp whose ``@app.query()`` function answers it (this package's does, and its ServerApp sets "
                      "this); a ClientApp without one would fail each query with an error in the app's log. Off: until a "
                      "node's reply carries its rank, draws order it by node id, which one log line says.",
    }
    CONTRACT: ClassVar[str] = (
        "Client contract: a training reply holds exactly one ArrayRecord (the trained model, with the "
        "parameter names it was sent) and one MetricRecord with ``num-examples``; bytes the method needs "
        "back (e.g. SCAFFOLD's ``scaffold-control-delta``) travel in ConfigRecords. An evaluation reply "
        "holds one MetricRecord with ``accuracy`` and ``num-examples``. Replies that break the contract, "
        "hold NaN or Inf, or exceed the update bounds are refused with a logged reason and change nothing."
    )

    def __init__(
        self,
        method: ServerAlgorithm,
        *,
        clients_per_round: int | None = None,
        fraction_train: float = 1.0,
        min_train_nodes: int = 1,
        min_available_nodes: int = 2,
        fraction_evaluate: float = 1.0,
        min_evaluate_nodes: int = 1,
        weighted_by_key: str = NUM_EXAMPLES,
        train_metrics_aggr_fn: MetricsFn | None = None,
        seed: int = 0,
        device: str | torch.device = "cpu",
        store_dir: str | None = None,
        arrayrecord_key: str = "arrays",
        configrecord_key: str = "config",
        evaluate_metrics_aggr_fn: MetricsFn | None = None,
        accuracy_key: str = ACCURACY,
        max_update_ratio: float = MAX_UPDATE_RATIO,
        max_weight_ratio: float = MAX_WEIGHT_RATIO,
        max_median_ratio: float = MAX_MEDIAN_RATIO,
        lr: float | None = None,
        local_steps: int | None = None,
        node_wait_timeout: float = NODE_WAIT_TIMEOUT,
        lost_node_rounds: int = LOST_AFTER,
        rank_key: str | None = "partition-id",
        rank_query: bool = False,
        unseen_clients: Collection[int] = (),
        new_client_finetune_steps: int = 0,
        tracker: TrackerArg = None,
        tracker_dir: str = "runs",
    ) -> None:
        #: settings sent with every training instruction unless the user's config has them
        self.client_defaults = {k: v for k, v in ((LR, lr), (LOCAL_STEPS, local_steps)) if v is not None}
        self.server = MethodServer(method, clients_per_round, fraction_train=fraction_train,
                                   min_train_clients=min_train_nodes, seed=seed, device=device, store_dir=store_dir,
                                   bounds=ReplyBounds(max_update_ratio, max_weight_ratio, max_median_ratio), rank_key=rank_key,
                                   unseen=unseen_clients, finetune_steps=new_client_finetune_steps)
        self.nodes = NodeWatch(node_wait_timeout, lost_after=lost_node_rounds)
        self.rank_query = rank_query
        self._outbox: list[Message] = []
        #: the bytes of each message of ``_outbox`` (``strategies.traffic``)
        self._sent_bytes: list[int] = []
        self.min_available_nodes = min_available_nodes
        self.fraction_evaluate, self.min_evaluate_nodes = fraction_evaluate, min_evaluate_nodes
        self.weighted_by_key = weighted_by_key
        self.train_metrics_aggr_fn = train_metrics_aggr_fn
        self.arrayrecord_key = arrayrecord_key
        self.configrecord_key = configrecord_key
        self.accuracy_key = accuracy_key
        #: the personalized summary of ``accuracy_key``, added to what ``evaluate_metrics_aggr_fn`` returns
        self.personalized = PersonalizedMetrics(accuracy_key, IDENTITIES + ((rank_key,) if rank_key else ()))
        self.evaluate_metrics_aggr_fn = evaluate_metrics_aggr_fn
        #: the strategy's own trackers (``strategies.tracking``), None without ``tracker``
        self.tracking = StrategyTracking.of(tracker, tracker_dir, self, {"clients_per_round": clients_per_round, "seed": seed})

    def start(self, *args: Any, **kwargs: Any) -> Any:
        """Flower's ``Strategy.start``, its closing block a line per round and phase (``strategies.final_results``);
        then the trackers get the run's summary and are closed. An ``evaluate_fn`` is refused (``ValueError``)
        for a method without a global model: Flower's loop would hand it the initial model every round."""
        evaluate_fn = inspect.signature(Strategy.start).bind(self, *args, **kwargs).arguments.get("evaluate_fn")
        checked_evaluate_fn(evaluate_fn, self.method, type(self).__name__)
        try:
            with compact_final_results():
                result = super().start(*args, **kwargs)
            log_final_results(result)
            return result
        finally:
            if self.tracking is not None:
                self.tracking.finish()

    @property
    def method(self) -> ServerAlgorithm:
        return self.server.method

    def summary(self) -> None:
        log(INFO, "\t├──> Method: %s", self.method)
        log(INFO, "\t├──> Clients per round: %s", self.server.clients_per_round or f"fraction {self.server.fraction_train}")
        log(INFO, "\t└──> Evaluation: fraction %.2f of nodes, each on the model it would use", self.fraction_evaluate)

    def _nodes(self, grid: Grid) -> list[int]:
        return self.nodes.wait(grid, self.min_available_nodes)

    def _prepare_draw(self, grid: Grid, nodes: list[int], k: int) -> None:
        """Before ``k`` of ``nodes`` are drawn: with ``rank_query``, ask the unranked ones for their rank
        (``strategies.ranks``)."""
        def ask(ids: list[Any]) -> list[tuple[Any, dict[str, Any]]]:
            return [(node, _metrics(reply)) for node, reply in query(grid, ids, self.nodes.timeout) if not reply.has_error()]

        prepare_draw(self.server, nodes, k, ask if self.rank_query else None, MESSAGE_ADVICE)

    def _initialize(self, arrays: ArrayRecord) -> None:
        """Learn the model from the first arrays Flower's loop hands the strategy; later ones are the global
        model it holds, which a method central DP composes with goes on from (``MethodServer.carry_on``)."""
        if not self.server.initialized:
            self.server.initialize(record_numpy(arrays))
        elif self.method.aggregate_only:
            self.server.carry_on(record_numpy(arrays))

    def _messages(self, plan: Iterable[Instruction], config: ConfigRecord, server_round: int, kind: str) -> list[Message]:
        """One message per instruction; its arrays made once per round where clients share them (``RoundArrays``).
        Each message's bytes go to ``_sent_bytes``."""
        out = []
        made, names = self.server.round_arrays(numpy_array), self.server.layout_names
        last: tuple[list[Array], ArrayRecord] | None = None
        for ins in plan:
            encoded = made(ins.model)
            if last is None or last[0] is not encoded:  # one record for the clients sent one model
                last = (encoded, array_record(dict(zip(names, encoded))))
            arrays = last[1]
            record = ConfigRecord({**config, **ins.config, SERVER_ROUND: server_round})
            out.append(Message(content=RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: record}),
                               message_type=kind, dst_node_id=ins.client_id))  # type: ignore[call-overload]  # a node id (int) in this API
        sizes: dict[int, int] = {}
        self._sent_bytes = [content_bytes(msg.content, sizes) for msg in out]
        return out

    def _cost(self, good: Iterable[tuple[int, Message]]) -> dict[str, float]:
        """The round's bytes (``_sent_bytes`` down, the replies ``good`` up) and the server's peak memory."""
        return {**traffic_metrics(self._sent_bytes, [content_bytes(msg.content) for _, msg in good]),
                PEAK_MEMORY: peak_rss_mib()}

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        check_privacy_mechanisms(self, self.method)
        self._initialize(arrays)
        nodes = self._nodes(grid)
        self._prepare_draw(grid, nodes, self.server.participants(len(nodes)))
        plan = self.server.plan_training(server_round, nodes)
        log_trainers("configure_train", server_round, len(plan), "node", len(self.nodes.failures.lost))
        config = ConfigRecord({**self.client_defaults, **config})
        self._outbox = self._messages(plan, config, server_round, MessageType.TRAIN)
        if plan and (problem := self.server.settings_problem({**config, **plan[0].config})):
            log(WARNING, "%s: %s", type(self).__name__, problem)
        return self._outbox

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        good, failed = split_replies(server_round, replies, self._outbox, self.nodes.failures)
        learn_ranks(self.server, [(node_id, _metrics(msg)) for node_id, msg in good])
        batch, raws = RoundReplies(failed=failed), []
        for node_id, msg in good:
            try:
                raws.append(raw_reply(node_id, msg, self.weighted_by_key))
            except UpdateRejected as err:
                batch.reject(node_id, str(err))
        receive_round(self.server, server_round, raws, batch, type(self).__name__)
        model = self.server.aggregate(server_round, batch.accepted)
        arrays = None if model is None else numpy_record(self.server.to_named_arrays(model))
        if self.train_metrics_aggr_fn is not None and batch.accepted:
            records = [RecordDict({"metrics": MetricRecord({**_plain(r.metrics), self.weighted_by_key: r.num_examples})})
                       for r in batch.accepted]
            metrics = MetricRecord({**dict(self.train_metrics_aggr_fn(records, self.weighted_by_key)), **reply_counts(batch),
                                    **reply_cost(r.metrics for r in batch.accepted), **self.method.round_metrics(),
                                    **self._cost(good)})
        else:
            metrics = MetricRecord({**round_replies_metrics(batch, self.weighted_by_key), **self.method.round_metrics(),
                                    **self._cost(good)})
        if self.tracking is not None:
            self.tracking.train(server_round, dict(metrics))
        return arrays, metrics

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        if self.fraction_evaluate <= 0:
            return []
        self._initialize(arrays)
        nodes = self._nodes(grid)
        self._prepare_draw(grid, nodes, self.server.evaluators(len(nodes), self.fraction_evaluate, self.min_evaluate_nodes))
        plan = self.server.evaluation_plan(server_round, nodes, self.fraction_evaluate, self.min_evaluate_nodes)
        self._outbox = self._messages(plan, config, server_round, MessageType.EVALUATE)
        return self._outbox

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """The clients' evaluation metrics aggregated by ``evaluate_metrics_aggr_fn``; replies without a
        usable ``num-examples``, or with an ``accuracy_key`` outside [0, 1] (``check_evaluation``), are
        left out with a logged reason."""
        good, _ = split_replies(server_round, replies, self._outbox, self.nodes.failures)
        rows = ranked_rows(self.server, [(node_id, _metrics(msg, self.weighted_by_key)) for node_id, msg in good])
        kept, new, refused = checked_groups(self.server.is_unseen, rows, self.accuracy_key, self.server.bounds.max_weight_ratio)
        log_refused_evaluations(server_round, refused)
        if not kept and not new:
            return None
        records = [RecordDict({"metrics": MetricRecord({**{k: v for k, v in row.items() if k != NUM_EXAMPLES},
                                                        self.weighted_by_key: row[NUM_EXAMPLES]})}) for _, row in kept]
        out = self.personalized(records, self.weighted_by_key) if kept else MetricRecord()
        if self.evaluate_metrics_aggr_fn is not None and records:  # the app's own aggregation wins where names meet
            out = MetricRecord({**out, **self.evaluate_metrics_aggr_fn(records, self.weighted_by_key)})
        out = MetricRecord({**out, **self.personalized.new_clients([r for _, r in new])})
        out = MetricRecord({**out, **self._cost(good)})
        if self.tracking is not None:
            self.tracking.evaluate(server_round, dict(out), [row[self.accuracy_key] for _, row in kept])
        return out


def _metrics(msg: Message, weighted_by_key: str = NUM_EXAMPLES) -> dict[str, Any]:
    """The reply's metrics (all its MetricRecords together), its sample count as ``num-examples``."""
    metrics = merged(msg.content, MetricRecord)
    if weighted_by_key in metrics:
        metrics[NUM_EXAMPLES] = metrics[weighted_by_key]
    return metrics


def _plain(metrics: Any) -> dict[str, Any]:
    return {k: v for k, v in metrics.items() if is_number(v)}


def raw_reply(node_id: int, msg: Message, weighted_by_key: str = NUM_EXAMPLES) -> RawReply:
    """A training reply's parts; ``UpdateRejected`` when its records are not what the contract says."""
    content = msg.content
    array_records, metric_records = records(content, ArrayRecord), records(content, MetricRecord)
    if len(array_records) != 1 or len(metric_records) != 1:
        raise UpdateRejected("a reply must hold exactly one ArrayRecord and one MetricRecord")
    record = next(iter(array_records.values()))
    metrics = dict(next(iter(metric_records.values())))
    if weighted_by_key not in metrics:
        raise UpdateRejected(f"MetricRecord lacks '{weighted_by_key}'")
    extras = merged(content, ConfigRecord)
    arrays = [decoded(f"array '{name}'", partial(array_numpy, array)) for name, array in record.items()]
    return RawReply(node_id, arrays, list(record.keys()), metrics[weighted_by_key], metrics, extras)
