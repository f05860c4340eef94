"""The legacy-API strategy every method of this package runs on (``flwr.server.strategy.Strategy``)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from logging import DEBUG, WARNING
from typing import Any, ClassVar, TypedDict

import numpy as np
import torch
from flwr.common import (
    Code,
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    GetPropertiesIns,
    Parameters,
    Scalar,
    ndarray_to_bytes,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.common.logger import log
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy

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
    is_finite_number,
    secure_aggregate_arrays,
)
from flower_pfl.engine.server_algorithm import Instruction, ServerAlgorithm
from flower_pfl.engine.wording import agreeing, counted
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
from strategies.failures import LOST_AFTER, UNNAMED, NodeFailures
from strategies.nodes import NODE_WAIT_TIMEOUT
from strategies.per_method import SHARED_OPTION_DOCS, PerMethodDocs
from strategies.privacy import check_privacy_mechanisms
from strategies.ranks import LEGACY_ADVICE, learn_ranks, prepare_draw, ranked_rows
from strategies.replies import log_trainers, receive_round
from strategies.tracking import StrategyTracking, TrackerArg
from strategies.traffic import legacy_bytes

ConfigFn = Callable[[int], dict[str, Scalar]]
MetricsFn = Callable[[list[tuple[int, dict[str, Scalar]]]], dict[str, Scalar]]
EvaluateFn = Callable[[int, list[np.ndarray], dict[str, Scalar]], "tuple[float, dict[str, Scalar]] | None"]


def client_id(proxy: ClientProxy) -> int | str:
    """The client's node id (legacy proxies carry it as a string; the Message API as an int)."""
    return int(proxy.cid) if proxy.cid.isdigit() else proxy.cid


def record_failures(failures: NodeFailures, server_round: int, failed: Sequence[Any], phase: str) -> None:
    """A legacy round's ``failures`` in ``failures``: ``(proxy, result)`` pairs with a failed status, or
    exceptions Flower's legacy loop passes without their client (``UNNAMED``: counted, never declared lost)."""
    for failure in failed:
        if isinstance(failure, tuple):
            failures.record(server_round, client_id(failure[0]), f"{failure[1].status!r}", phase=phase)
        else:
            failures.record(server_round, UNNAMED, f"{failure!r}", phase=phase)


class LegacyOptions(TypedDict, total=False):
    """``LegacyMethodStrategy``'s options as keyword arguments of the method classes (``strategies.FedMCSA(...,
    **options)``), documented in ``LegacyMethodStrategy.OPTION_DOCS``."""

    initial_parameters: Parameters | Mapping[str, Any] | None
    clients_per_round: int | None
    fraction_fit: float
    min_fit_clients: int
    min_available_clients: int
    fraction_evaluate: float
    min_evaluate_clients: int
    accept_failures: bool
    fit_metrics_aggregation_fn: MetricsFn | None
    inplace: bool
    on_fit_config_fn: ConfigFn | None
    on_evaluate_config_fn: ConfigFn | None
    evaluate_metrics_aggregation_fn: MetricsFn | None
    evaluate_fn: EvaluateFn | None
    accuracy_key: str
    seed: int
    device: str | torch.device
    store_dir: str | None
    max_update_ratio: float
    max_weight_ratio: float
    max_median_ratio: float
    lr: float | None
    local_steps: int | None
    node_wait_timeout: float
    lost_node_rounds: int
    rank_key: str | None
    tracker: TrackerArg
    tracker_dir: str


class LegacyMethodStrategy(PerMethodDocs, Strategy):
    """A method's server algorithm (``flower_pfl.engine.server_algorithm``) as a legacy strategy
    (``configure_fit`` / ``aggregate_fit``).

    ``initial_parameters`` is every client's starting model; give it as a ``state_dict`` (or any
    name -> array mapping) so the server knows the parameters' names (layer-wise methods group by
    them, FedAttn finds the biases by them); a ``Parameters`` object carries no names. Clients
    receive and return the arrays in that order. ``on_fit_config_fn(round)`` (e.g. ``lr``,
    ``local-steps``, ``batch-size``) goes to every participant together with the method's own
    client settings and ``server-round``.
    """

    OPTION_DOCS: ClassVar[dict[str, str]] = {
        **SHARED_OPTION_DOCS,
        "initial_parameters": "Every client's starting model: a state_dict (names kept) or Flower Parameters "
                              "(no names; None: asked from one client).",
        "clients_per_round": "Clients that train each round (None: ``fraction_fit`` of the available clients).",
        "fraction_fit": "Fraction of the available clients that train when ``clients_per_round`` is None.",
        "min_fit_clients": "Least number of clients that train when ``fraction_fit`` is used.",
        "min_available_clients": "Clients to wait for before a round starts (at most ``node_wait_timeout`` seconds).",
        "min_evaluate_clients": "Least number of clients that evaluate when ``fraction_evaluate`` < 1.",
        "accept_failures": "False: a round in which any client failed changes nothing (as Flower's FedAvg).",
        "fit_metrics_aggregation_fn": "Aggregates the accepted clients' ``(num_examples, metrics)`` (default: every "
                                      "numeric metric's sample-weighted mean); reply counts are added.",
        "inplace": "Accepted for Flower's FedAvg's signature; no effect (received arrays are never modified).",
        "fraction_evaluate": "Fraction of the available clients that evaluate (each the model it would use); 0 turns evaluation off.",
        "on_fit_config_fn": "Config sent with every training instruction, by round.",
        "on_evaluate_config_fn": "Config sent with every evaluation instruction, by round.",
        "evaluate_metrics_aggregation_fn": "Aggregates the clients' ``(num_examples, metrics)`` evaluations, as Flower's "
                                           "FedAvg's (None: every numeric metric's sample-weighted mean under its own name); "
                                           "the personalized summary of ``accuracy_key`` (``strategies.aggregated_metrics.PersonalizedMetrics``) "
                                           "is added either way. The loss is Flower's sample-weighted mean.",
        "evaluate_fn": "Server-side evaluation of the global model, as Flower's FedAvg's: "
                       "``evaluate_fn(round, arrays, config) -> (loss, metrics) | None``; refused for a method "
                       "without a global model.",
        "max_weight_ratio": "Count a reply's ``num_examples`` at most this multiple of the lower median of the clients' first claims, and never more than its own client's first count (``flower_pfl.engine.reply_checks.WeightBook``); ``math.inf``: off.",
        "node_wait_timeout": "Seconds a round waits for ``min_available_clients`` before it goes on with the clients connected.",
        "lost_node_rounds": "A client that failed in this many consecutive rounds it was sent work is lost: named once, "
                            "with the round since which it fails and the error's name, and not sampled any more "
                            "(``strategies.failures``); 0: never. Every failure is still counted, one log line per client and cause.",
        "rank_key": "The metric (or property) under which clients report a stable rank (e.g. their partition id) that orders "
                    "them for sampling and aggregation, as node ids change from run to run; learned from fit and evaluate "
                    "metrics and, before a draw, from one ``get_properties`` call to each client without one. None: clients "
                    "are ordered by node id.",
    }
    CONTRACT: ClassVar[str] = (
        "Client contract: ``fit`` returns the trained arrays in the order they were sent, the number of "
        "training examples and metrics; bytes the method needs back (e.g. SCAFFOLD's "
        "``scaffold-control-delta``) travel inside those metrics. ``evaluate`` returns metrics with ``accuracy``. "
        "Replies that break the contract, hold NaN or Inf, or exceed the update bounds are refused with a "
        "logged reason and change nothing."
    )

    #: the bytes of each instruction of the last call to ``configure_fit`` / ``configure_evaluate``
    _sent_bytes: Sequence[int] = ()

    def __init__(
        self,
        method: ServerAlgorithm,
        *,
        initial_parameters: Parameters | Mapping[str, Any] | None = None,
        clients_per_round: int | None = None,
        fraction_fit: float = 1.0,
        min_fit_clients: int = 1,
        min_available_clients: int = 2,
        fraction_evaluate: float = 1.0,
        min_evaluate_clients: int = 1,
        accept_failures: bool = True,
        fit_metrics_aggregation_fn: MetricsFn | None = None,
        inplace: bool = True,
        on_fit_config_fn: ConfigFn | None = None,
        on_evaluate_config_fn: ConfigFn | None = None,
        evaluate_metrics_aggregation_fn: MetricsFn | None = None,
        evaluate_fn: EvaluateFn | None = None,
        accuracy_key: str = ACCURACY,
        seed: int = 0,
        device: str | torch.device = "cpu",
        store_dir: str | None = None,
        max_update_ratio: float = MAX_UPDATE_RATIO,
        max_weight_ratio: float = MAX_WEIGHT_RATIO,
        max_median_ratio: float = MAX_MEDIAN_RATIO,
        lr: float | None = None,
        local_steps: int | None = None,
        node_wait_timeout: float = NODE_WAIT_TIMEOUT,
        lost_node_rounds: int = LOST_AFTER,
        rank_key: str | None = "partition-id",
        unseen_clients: Collection[int] = (),
        new_client_finetune_steps: int = 0,
        tracker: TrackerArg = None,
        tracker_dir: str = "runs",
    ) -> None:
        super().__init__()
        if not node_wait_timeout >= 0:
            raise ValueError(f"node_wait_timeout must be >= 0 seconds, got {node_wait_timeout!r}")
        #: settings sent with every training instruction unless the user's config has them
        self.client_defaults = {k: v for k, v in ((LR, lr), (LOCAL_STEPS, local_steps)) if v is not None}
        self.server = MethodServer(method, clients_per_round, fraction_train=fraction_fit, min_train_clients=min_fit_clients,
                                   seed=seed, device=device, store_dir=store_dir, rank_key=rank_key, unseen=unseen_clients,
                                   bounds=ReplyBounds(max_update_ratio, max_weight_ratio, max_median_ratio),
                                   finetune_steps=new_client_finetune_steps)
        self.node_wait_timeout = node_wait_timeout
        #: the clients' failures; the lost ones are not sampled (``strategies.failures``)
        self.failures = NodeFailures(lost_node_rounds)
        self.initial_parameters: Parameters | None = None
        self._secure = False  # a secure-aggregation workflow runs the round: every result carries the results' mean
        if initial_parameters is not None:
            self._initialize(initial_parameters)
        self.min_available_clients, self.fraction_evaluate, self.min_evaluate_clients = min_available_clients, fraction_evaluate, min_evaluate_clients
        self.accept_failures = accept_failures  # (``inplace`` is only accepted: arrays are never modified)
        self.fit_metrics_aggregation_fn, self.accuracy_key = fit_metrics_aggregation_fn, accuracy_key
        self.on_fit_config_fn, self.on_evaluate_config_fn = on_fit_config_fn, on_evaluate_config_fn
        #: the personalized summary of ``accuracy_key``, added to what ``evaluate_metrics_aggregation_fn`` returns
        self.personalized = PersonalizedMetrics(accuracy_key, IDENTITIES + ((rank_key,) if rank_key else ()))
        self.evaluate_metrics_aggregation_fn, self.evaluate_fn = evaluate_metrics_aggregation_fn, checked_evaluate_fn(evaluate_fn, method, type(self).__name__)
        #: the strategy's own trackers (``strategies.tracking``; closed at the end of the process), None without ``tracker``
        self.tracking = StrategyTracking.of(tracker, tracker_dir, self, {"clients_per_round": clients_per_round, "seed": seed})

    @property
    def method(self) -> ServerAlgorithm:
        return self.server.method

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.method})"

    def _initialize(self, initial: Parameters | Mapping[str, Any]) -> None:
        if isinstance(initial, Parameters):
            arrays = parameters_to_ndarrays(initial)
            named = {str(i): a for i, a in enumerate(arrays)}
        else:
            named = {k: v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v) for k, v in initial.items()}
        self.server.initialize(named)
        self.initial_parameters = ndarrays_to_parameters(list(named.values()))

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        return self.initial_parameters

    def _held(self, parameters: Parameters) -> None:
        """Learn the model from the first parameters Flower's loop hands the strategy; later ones are the global
        model it holds, which a method central DP composes with goes on from (``MethodServer.carry_on``)."""
        if not self.server.initialized:
            self._initialize(parameters)
        elif self.method.aggregate_only:
            self.server.carry_on(parameters_to_ndarrays(parameters))

    def _clients(self, client_manager: ClientManager) -> dict[Any, ClientProxy]:
        # Flower's ``start_grid`` registers the grid's nodes when ``num_available`` / ``all`` / ``sample``
        # are called (else every 5 s, on a thread): ask first, so the first round does not wait for that thread.
        client_manager.num_available()
        if not client_manager.wait_for(self.min_available_clients, timeout=int(self.node_wait_timeout)):
            available = client_manager.num_available()
            log(WARNING, "%s connected, %d wanted; going on with %s after %.0f s", counted(available, "client"),
                self.min_available_clients, agreeing(available, "it", "them"), self.node_wait_timeout)
        lost = self.failures.lost
        return {cid: proxy for proxy in client_manager.all().values() if (cid := client_id(proxy)) not in lost}

    def _account(self, server_round: int, results: Sequence[tuple[ClientProxy, Any]], failures: Sequence[Any], phase: str) -> None:
        """The round's failed clients recorded (one log line per client and cause, ``strategies.failures``), the
        ones that answered cleared, and the clients that keep failing declared lost."""
        record_failures(self.failures, server_round, failures, phase)
        for proxy, _ in results:
            self.failures.answered(client_id(proxy))
        self.failures.end_round(server_round)

    def _prepare_draw(self, clients: Mapping[Any, ClientProxy], k: int, server_round: int) -> None:
        """Before ``k`` of ``clients`` are drawn: ask the unranked ones for their rank (``strategies.ranks``)."""
        def ask(ids: list[Any]) -> list[tuple[Any, Mapping[str, Scalar]]]:
            return properties({c: clients[c] for c in ids}, self.node_wait_timeout, server_round)

        prepare_draw(self.server, list(clients), k, ask, LEGACY_ADVICE)

    def _instructions(self, plan: Iterable[Instruction], clients: Mapping[Any, ClientProxy], config: dict[str, Scalar],
                      server_round: int, kind: type) -> list[tuple[ClientProxy, Any]]:
        """One instruction per client; its arrays made once per round where clients share them (``RoundArrays``).
        Each instruction's bytes go to ``_sent_bytes``."""
        made = self.server.round_arrays(ndarray_to_bytes)
        out = [(clients[ins.client_id], kind(Parameters(tensors=list(made(ins.model)), tensor_type="numpy.ndarray"),
                                             {**config, **ins.config, SERVER_ROUND: server_round})) for ins in plan]
        self._sent_bytes = [legacy_bytes(ins.parameters, ins.config) for _, ins in out]
        return out

    def _cost(self, received: Sequence[int]) -> dict[str, float]:
        """The round's bytes (``_sent_bytes`` down, ``received`` up) and the server's peak memory."""
        return {**traffic_metrics(self._sent_bytes, received), PEAK_MEMORY: peak_rss_mib()}

    def configure_fit(self, server_round: int, parameters: Parameters, client_manager: ClientManager) -> list[tuple[ClientProxy, FitIns]]:
        self._secure = check_privacy_mechanisms(self, self.method)
        self._held(parameters)
        clients = self._clients(client_manager)
        self._prepare_draw(clients, self.server.participants(len(clients)), server_round)
        plan = self.server.plan_training(server_round, clients)
        log_trainers("configure_fit", server_round, len(plan), "client", len(self.failures.lost))
        config = {**self.client_defaults, **(dict(self.on_fit_config_fn(server_round)) if self.on_fit_config_fn else {})}
        if plan and (problem := self.server.settings_problem({**config, **plan[0].config})):
            log(WARNING, "%s: %s", type(self).__name__, problem)
        return self._instructions(plan, clients, config, server_round, FitIns)

    def aggregate_fit(
        self, server_round: int, results: list[tuple[ClientProxy, FitRes]], failures: list[tuple[ClientProxy, FitRes] | BaseException]
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        learn_ranks(self.server, [(client_id(proxy), res.metrics) for proxy, res in results])
        batch, raws = RoundReplies(failed=len(failures)), []
        self._account(server_round, results, failures, "train")
        for proxy, res in results:
            try:
                metrics = dict(res.metrics)
                arrays = decoded("parameters", lambda: parameters_to_ndarrays(res.parameters))  # noqa: B023
                if self._secure:  # the results' mean, which secure aggregation sums in float64
                    arrays = secure_aggregate_arrays(arrays)
                raws.append(RawReply(client_id(proxy), arrays, None, res.num_examples, metrics, metrics))
            except UpdateRejected as err:
                batch.reject(client_id(proxy), str(err))
        receive_round(self.server, server_round, raws, batch, type(self).__name__)
        if failures and not self.accept_failures:
            log(WARNING, "round %s: %s failed and accept_failures is False: the round changes nothing", server_round,
                counted(len(failures), "client"))
            batch.accepted.clear()
        model = self.server.aggregate(server_round, batch.accepted)
        parameters = None if model is None else ndarrays_to_parameters(self.server.to_arrays(model))
        if self.fit_metrics_aggregation_fn is not None and batch.accepted:
            own = self.fit_metrics_aggregation_fn([(r.num_examples, dict(r.metrics)) for r in batch.accepted])
            metrics = {**own, **reply_counts(batch), **reply_cost(r.metrics for r in batch.accepted), **self.method.round_metrics()}
        else:
            metrics = {**round_replies_metrics(batch), **self.method.round_metrics()}
        metrics.update(self._cost([legacy_bytes(res.parameters, res.metrics, numbers=1) for _, res in results]))
        if self.tracking is not None:
            self.tracking.train(server_round, metrics)
        return parameters, metrics

    def configure_evaluate(self, server_round: int, parameters: Parameters, client_manager: ClientManager) -> list[tuple[ClientProxy, EvaluateIns]]:
        if self.fraction_evaluate <= 0 or not self.server.initialized:
            return []
        self._held(parameters)
        clients = self._clients(client_manager)
        self._prepare_draw(clients, self.server.evaluators(len(clients), self.fraction_evaluate, self.min_evaluate_clients),
                           server_round)
        plan = self.server.evaluation_plan(server_round, clients, self.fraction_evaluate, self.min_evaluate_clients)
        config = dict(self.on_evaluate_config_fn(server_round)) if self.on_evaluate_config_fn else {}
        return self._instructions(plan, clients, config, server_round, EvaluateIns)

    def aggregate_evaluate(
        self, server_round: int, results: list[tuple[ClientProxy, EvaluateRes]], failures: list[tuple[ClientProxy, EvaluateRes] | BaseException]
    ) -> tuple[float | None, dict[str, Scalar]]:
        self._account(server_round, results, failures, "evaluate")
        rows = ranked_rows(self.server, [(client_id(proxy), {**res.metrics, NUM_EXAMPLES: res.num_examples}) for proxy, res in results])
        losses = {client_id(proxy): res.loss for proxy, res in results}
        kept_rows, new, refused = checked_groups(self.server.is_unseen, rows, self.accuracy_key, self.server.bounds.max_weight_ratio)
        log_refused_evaluations(server_round, refused)
        if not kept_rows and not new:
            return None, {}
        weighted = [(row[NUM_EXAMPLES], float(losses[cid])) for cid, row in kept_rows  # type: ignore[index]
                    if is_finite_number(losses[cid])]  # type: ignore[index]  # client ids are the proxies' cids
        # Flower's sample-weighted mean (its ``weighted_loss_avg``), summed in the same order
        loss = sum(n * value for n, value in weighted) / sum(n for n, _ in weighted) if weighted else None
        pairs = [(int(row[NUM_EXAMPLES]), {k: v for k, v in row.items() if k != NUM_EXAMPLES}) for _, row in kept_rows]
        metrics = self.personalized.legacy(pairs) if pairs else {}
        if self.evaluate_metrics_aggregation_fn is not None and pairs:  # the app's own aggregation wins where names meet
            metrics.update(self.evaluate_metrics_aggregation_fn(pairs))
        metrics.update(self.personalized.new_clients([r for _, r in new]))
        metrics.update(self._cost([legacy_bytes(None, res.metrics, numbers=2) for _, res in results]))
        if self.tracking is not None:
            self.tracking.evaluate(server_round, {**({"loss": loss} if loss is not None else {}), **metrics},
                                   [row[self.accuracy_key] for _, row in kept_rows])
        return loss, metrics

    def evaluate(self, server_round: int, parameters: Parameters) -> tuple[float, dict[str, Scalar]] | None:
        if self.evaluate_fn is None or not self.server.initialized:
            return None
        self._held(parameters)
        model = self.method.global_model()  # a method with an evaluate_fn has one (``checked_evaluate_fn``)
        return None if model is None else self.evaluate_fn(server_round, self.server.to_arrays(model), {})


def properties(proxies: Mapping[Any, ClientProxy], timeout: float, group_id: int) -> list[tuple[Any, Mapping[str, Scalar]]]:
    """``(id, properties)`` of the clients whose ``get_properties`` answers (asked in parallel). A client
    without it answers ``GET_PROPERTIES_NOT_IMPLEMENTED``; on a grid, a ClientApp that cannot take the
    legacy message answers with an error, which the proxy raises: both are left out."""
    def ask(item: tuple[Any, ClientProxy]) -> tuple[Any, Mapping[str, Scalar]] | None:
        cid, proxy = item
        try:
            res = proxy.get_properties(GetPropertiesIns({}), timeout, group_id)
        except Exception as err:
            log(DEBUG, "client %s: get_properties failed (%s)", cid, err)
            return None
        return (cid, res.properties) if res.status.code == Code.OK else None

    with ThreadPoolExecutor() as pool:
        return [answer for answer in pool.map(ask, proxies.items()) if answer is not None]
