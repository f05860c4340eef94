"""The ServerApp: build the strategy the run config asks for, run it, write the results folder."""

from __future__ import annotations

import os
import secrets
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Context
from flwr.common import ndarrays_to_parameters
from flwr.common.logger import log
from flwr.server import ServerConfig
from flwr.serverapp import Grid, ServerApp

from client_apps.flower_internals import in_memory_grid, start_grid
from client_apps.persisted_state import STATE_PARTITIONS, STATE_ROUNDS
from flower_pfl.engine.client_algorithm import RESUMED_AFTER, RUN_KEY
from flower_pfl.engine.disk_store import DiskClientModelStore
from flower_pfl.engine.extras import MissingExtra
from flower_pfl.engine.memory import in_blocks
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.engine.new_clients import NewClients
from flower_pfl.engine.params import param_specs
from flower_pfl.engine.reply_checks import ReplyBounds
from flower_pfl.engine.sampling import Sampler
from flower_pfl.engine.server_algorithm import PersonalizedAlgorithm, ServerAlgorithm
from flower_pfl.engine.wording import agreeing, counted
from flower_pfl.experiment.build import (
    check_device,
    check_method_applies,
    has_hidden_layers,
    initial_arrays,
    make_model,
    training_config,
)
from flower_pfl.experiment.clients import CLIENT_GROUP
from flower_pfl.experiment.config import ConfigError, ExperimentConfig
from flower_pfl.experiment.footprint import DEPLOYMENT, IN_PROCESS, SIMULATION, check_fits
from flower_pfl.experiment.unseen import unseen_clients
from flower_pfl.reports.diagnostics import save_run_diagnostics
from flower_pfl.reports.figures import data_title, run_title
from flower_pfl.run.heap import frozen_heap
from flower_pfl.run.quiet import DivertRecords, silence_runtime_noise
from flower_pfl.run.results import (
    FAILURES,
    MODELS,
    SERVER_STATE,
    Coverage,
    RunFailed,
    RunRecorder,
    draw_partition,
    save_models,
    save_state,
)
from flower_pfl.run.trackers import RunTrackers, TrackerSettings, require_trackers
from server_apps.checkpoints import Checkpointer, Resumption, set_flower_state
from server_apps.client_grid import ClientGrid
from server_apps.cluster import check_cluster_paths
from server_apps.console import divert_client_failures, quiet_round_loop
from server_apps.factory import build_legacy_strategy, build_message_strategy, participants
from server_apps.guard import ReplyGuard
from server_apps.node_order import QUERY_TIMEOUT, RankedGrid, ask, query_nodes
from server_apps.recording import RecordedLegacyStrategy, RecordedStrategy
from server_apps.seeded import SeededClientManager
from strategies.aggregated_metrics import PersonalizedMetrics
from strategies.arrays import numpy_record
from strategies.failures import NodeFailures, listed
from strategies.nodes import NodeWatch

silence_runtime_noise()  # before Ray starts in a simulation (flower_pfl.run.quiet)
app = ServerApp()


def run_dir(cfg: ExperimentConfig) -> Path:
    """A new folder ``<output-dir>/<run name>-<time>`` (``ExperimentConfig.run_name``; relative paths
    from the current directory), with ``-2``, ``-3``, ... when runs start in the same second."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(cfg.output_dir).expanduser().resolve() / f"{cfg.run_name}-{stamp}"
    try:
        base.parent.mkdir(parents=True, exist_ok=True)
        for n in range(1, 10_000):
            path = base if n == 1 else base.with_name(f"{base.name}-{n}")
            try:
                path.mkdir()  # atomic: two runs never share a folder
                return path
            except FileExistsError:
                continue
    except OSError as err:  # a file, a path through a file, no permission, a read-only file system, ...
        if base.parent.exists() and not base.parent.is_dir():
            problem = "is a file, not a folder"
        elif isinstance(err, NotADirectoryError):
            problem = "has a file where a folder should be in its path"
        elif isinstance(err, PermissionError):
            problem = "is not writable"
        else:
            problem = "cannot hold a results folder"
        raise ConfigError(f"run config 'output-dir' = {cfg.output_dir!r}: {problem} ({err})") from err
    raise RuntimeError(f"cannot create a results folder next to {base}")


#: seconds between a simulation's looks for replies (``flwr run``: Flower's in-memory grid, 0.1 s by default)
PULL_INTERVAL = 0.01


def poll_faster(grid: Grid) -> None:
    """Let ``flwr run``'s in-memory grid look for replies every ``PULL_INTERVAL`` seconds instead of
    Flower's 0.1: a round no longer waits about 50 ms after its last reply (``benchmarks/speed.py``
    measures it). Other grids (a SuperLink's, the in-process one) are left as they are."""
    if isinstance(grid, in_memory_grid()) and grid.pull_interval > PULL_INTERVAL:
        grid.pull_interval = PULL_INTERVAL


@app.main()
def main(grid: Grid, context: Context) -> None:
    poll_faster(grid)
    run_experiment(grid, context.run_config)


def _continue_bmta(strategy: Any, best: float) -> None:
    """A resumed run's ``accuracy-bmta`` continues from the best mean accuracy recorded before."""
    fn = getattr(strategy, "evaluate_metrics_aggr_fn", None) or getattr(strategy, "evaluate_metrics_aggregation_fn", None)
    owner = getattr(strategy, "personalized", None) or getattr(fn, "__self__", fn)  # Flower's legacy: the bound ``.legacy``
    if isinstance(owner, PersonalizedMetrics):
        owner.best = best


def run_experiment(grid: Grid, run_config: Mapping[str, Any]) -> Path:
    """Run the experiment ``run_config`` describes on ``grid`` (or continue the one ``resume-from``
    names); returns the results folder. Flower's round-by-round lines are dropped from the console
    unless ``verbose`` (``flower_pfl.run.quiet``): the run's own progress lines say how it goes."""
    with _logged(ConfigError):
        cfg = ExperimentConfig.from_mapping(run_config)
    with quiet_round_loop(enabled=not cfg.verbose), divert_client_failures() as tracebacks:
        try:
            run = _open(grid, cfg)
        except ConfigError:
            _keep_tracebacks(tracebacks)
            raise
        if tracebacks is not None:  # the simulation's per-message tracebacks: in the results folder
            tracebacks.write_to(run.out / FAILURES)
        if cfg.figures:  # each client's training labels, as the nodes reported them at start
            draw_partition(run.out, run.info, data_title(cfg), log=lambda msg: log(WARNING, "%s", msg))
        strategy, sampler = _build(run)
        with frozen_heap():
            final = _train(run, strategy, sampler)
        return _finish(run, strategy, final)


def _keep_tracebacks(tracebacks: DivertRecords | None) -> None:
    """A refused run has no results folder: the nodes' tracebacks go to a file of their own, named on the console."""
    if tracebacks is not None and tracebacks.held:
        handle, path = tempfile.mkstemp(prefix="flower-pfl-refused-", suffix=".log")
        os.close(handle)
        tracebacks.write_to(path)
        log(ERROR, "flower-pfl: the nodes' %d error records (tracebacks) are in %s", tracebacks.count, path)


@contextmanager
def _logged(*errors: type[Exception]) -> Iterator[None]:
    """Log ``errors`` raised inside the block (Flower shows the ServerApp's log, not its traceback), then raise them."""
    try:
        yield
    except errors as err:
        log(ERROR, "%s", err)
        raise


@dataclass
class _Run:
    """A run being made: its config, nodes, results folder and, when resumed, its checkpoint."""

    cfg: ExperimentConfig
    grid: Grid
    initial: dict[str, np.ndarray]
    resumed: Resumption | None
    #: what each node reported at start (partition id, label counts), by node id
    info: dict[int, dict[str, Any]]
    out: Path
    recorder: RunRecorder
    #: every instruction names the run (clients keep their state under that name) and, when resumed, the round
    instructions: dict[str, Any]
    #: the partition ids of the clients that never train (``flower_pfl.experiment.unseen``)
    unseen: frozenset[int] = frozenset()

    @property
    def ranks(self) -> dict[int, int]:
        return {node: i["partition-id"] for node, i in self.info.items()}

    @property
    def hosts(self) -> dict[int, int]:
        """Client id -> the node hosting it, where nodes host several clients (else empty: ids are nodes)."""
        return hosting(self.info)

    @property
    def offset(self) -> int:
        """The rounds done before this process started (a resumed run's checkpointed round)."""
        return self.resumed.round if self.resumed is not None else 0

    @property
    def layout(self) -> dict[str, list[int]]:
        return {name: list(a.shape) for name, a in self.initial.items()}


def hosting(info: Mapping[int, Mapping[str, Any]]) -> dict[int, int]:
    """Client id -> hosting node of the start-up query's answers (``query_nodes``), where nodes host several
    clients; empty where every node is one client."""
    return {client: int(i["node"]) for client, i in info.items() if "node" in i}


def _federation(info: Mapping[int, Mapping[str, Any]]) -> int:
    """The federation's number of clients the nodes that host several report (``query_nodes`` checked that they
    agree), with a warning naming the clients no node hosts at start."""
    federation = max(int(i.get("num-partitions", 0)) for i in info.values())
    if missing := sorted(set(range(federation)) - set(info)):
        log(WARNING, "flower-pfl: %s of the federation's %d (num-partitions) %s hosted by no node at start: %s; the run "
            "goes on with the other %d, and a node that hosts them joins when it connects", counted(len(missing), "client"),
            federation, agreeing(len(missing), "is", "are"), listed(missing, 20), federation - len(missing))
    return federation


def _set_up_method(cfg: ExperimentConfig, initial: Mapping[str, np.ndarray]) -> ServerAlgorithm | None:
    """The run's server algorithm set up on its model, no client seen yet (``None``: Flower's own strategy)."""
    if cfg.entry.builtin:
        return None
    cls = cfg.entry.declaration
    names = {spec.name for spec in param_specs(cls)}
    server = MethodServer(cls(**{k: v for k, v in cfg.method_arguments().items() if k in names}))
    server.initialize(initial)
    return server.method


def _where(grid: Grid) -> str:
    """Where the run's nodes run (``flower_pfl.experiment.footprint``): in this process, in ``flwr run``'s
    simulation on this machine, or elsewhere."""
    if getattr(grid, "in_process", False):  # ``server_apps.inprocess.InProcessGrid``
        return IN_PROCESS
    return SIMULATION if isinstance(grid, in_memory_grid()) else DEPLOYMENT


def _warn_about_init(cfg: ExperimentConfig, initial: Mapping[str, np.ndarray]) -> None:
    if cfg.init == "zero" and has_hidden_layers(initial):
        log(WARNING, "init = 'zero' with model '%s': zero weights cannot break the symmetry of its hidden units (with "
            "every weight at zero they get no gradient at all: the model learns only its output bias); use init 'shared' "
            "or 'independent'", cfg.model)
    if cfg.init == "zero" and cfg.max_update_ratio > 0:
        log(WARNING, "init = 'zero' with max-update-ratio = %g: a client sent a near-zero model may have its honest update "
            "refused (the bound is relative to the norm of the model sent); max-update-ratio = 0 turns it off", cfg.max_update_ratio)


def _open(grid: Grid, cfg: ExperimentConfig) -> _Run:
    """Check what can be checked before anything is written, ask every node for its partition, then open
    the results folder (a new one, or the resumed run's) and its recorder."""
    with _logged(ConfigError, MissingExtra):
        check_device(cfg.device)
        check_cluster_paths(cfg)
        require_trackers(cfg.trackers)
        resumed = Resumption(cfg.resume_from) if cfg.resume_from else None
    with _logged(ConfigError):
        initial = initial_arrays(cfg)
        check_method_applies(cfg)
    _warn_about_init(cfg, initial)
    settings = cfg.to_run_config()
    with _logged(ConfigError):
        if resumed is not None:
            resumed.check(settings, {name: list(a.shape) for name, a in initial.items()})
        # every node loads its data to answer (what they cannot serve fails before the folder exists) and, in a
        # resumed run, says whether it has the client state the checkpoint needs
        info = query_nodes(grid, config=_state_query(resumed) if resumed is not None else None)
        if cfg.api == "legacy" and hosting(info):
            raise ConfigError("api 'legacy' sends each client a message of its own: its nodes host one client each "
                              "(num-clients = 0, no partition-ids in the node config); api 'message' runs nodes that "
                              "host several clients")
        if resumed is not None:
            _check_client_state(cfg, info)
        hosts = hosting(info)
        unseen = _unseen(cfg, info)
        check_fits(cfg, _set_up_method(cfg, initial), make_model(cfg), len(info), len(set(hosts.values())) or len(info),
                   _where(grid))
        out = resumed.folder if resumed is not None else run_dir(cfg)
    say: Callable[[str], None] = lambda msg: log(INFO, "%s", msg)
    trackers = RunTrackers(TrackerSettings(cfg.trackers, cfg.tracker_experiment, cfg.tracker_uri or _default_uri(cfg),
                                           cfg.tracker_group), out, out.name, settings,
                           resumed.round if resumed is not None else None) if cfg.trackers else None
    coverage = Coverage(clients=len(info) - len(unseen), share=cfg.min_evaluated_share)  # what a round must reach to count
    if resumed is not None:
        recorder = RunRecorder.resume(out, cfg.num_rounds, resumed.round, resumed.meta["elapsed"], log=say, trackers=trackers,
                                      coverage=coverage, figures=cfg.figures, target=cfg.target_accuracy)
        log(INFO, "flower-pfl: resuming %s after round %d", out, resumed.round)
        instructions: dict[str, Any] = {RUN_KEY: resumed.meta["run-key"], RESUMED_AFTER: resumed.round}
    else:
        recorder = RunRecorder(out, settings, cfg.num_rounds, log=say, trackers=trackers, coverage=coverage, figures=cfg.figures,
                               target=cfg.target_accuracy)
        instructions = {RUN_KEY: f"{out.name}-{secrets.token_hex(4)}"}  # unique per run
    ranks = {node: i["partition-id"] for node, i in info.items()}
    hosts = hosting(info)
    clients: Any = grid
    if hosts:
        federation = _federation(info)
        clients = ClientGrid(grid, hosts, learn=lambda nodes: ask(grid, nodes, QUERY_TIMEOUT), federation=federation)
    run = _Run(cfg, RankedGrid(clients, ranks), initial, resumed, info, out, recorder, instructions, unseen)  # type: ignore[arg-type]
    where = f"{counted(len(ranks), 'client')} on {counted(len(set(hosts.values())), 'node')}" if hosts else counted(len(ranks), "node")
    log(INFO, "flower-pfl: %s on %s (%s), %s, %s, evaluation every %d; results in %s", cfg.label, cfg.dataset,
        cfg.model, where, counted(cfg.num_rounds, "round"), cfg.eval_every, out)
    return run


def _unseen(cfg: ExperimentConfig, info: Mapping[int, Mapping[str, Any]]) -> frozenset[int]:
    """The partition ids of the clients that never train (``unseen-fraction``, ``unseen-domains``), from the
    federation's size and the domain each client reported."""
    federation = max((int(i.get("num-partitions", 0)) for i in info.values()), default=0) or len(info)
    groups = {int(i["partition-id"]): str(i.get(CLIENT_GROUP, "")) for i in info.values()}
    unseen = unseen_clients(cfg, federation, groups)
    if unseen:
        log(INFO, "flower-pfl: %s never %s (%s): %s", counted(len(unseen), "client"), agreeing(len(unseen), "trains", "train"),
            "; ".join(p for p in (f"unseen-fraction {cfg.unseen_fraction:g}" if cfg.unseen_fraction else "",
                                  f"unseen-domains {cfg.unseen_domains!r}" if cfg.unseen_domains else "") if p),
            listed(sorted(unseen), 20))
    return unseen


def _default_uri(cfg: ExperimentConfig) -> str:
    """MLflow's store when ``tracker-uri`` is empty: ``mlflow.db`` in ``output-dir``."""
    return f"sqlite:///{Path(cfg.output_dir).expanduser().resolve() / 'mlflow.db'}"


def _state_query(resumed: Resumption) -> dict[str, Any]:
    """What a resumed run's start-up query asks each node: does it have the client state of the
    round its partition last kept before the checkpoint (``client_apps.persisted_state.missing``)?"""
    needed = resumed.state_rounds()
    return {RUN_KEY: resumed.meta["run-key"], RESUMED_AFTER: resumed.round,
            STATE_PARTITIONS: list(needed), STATE_ROUNDS: list(needed.values())}


def _check_client_state(cfg: ExperimentConfig, info: Mapping[int, Mapping[str, Any]]) -> None:
    """Refuse to resume (``ConfigError``) when nodes lack the client state the checkpoint needs, naming each
    node's partition, folder and round, unless ``allow-empty-client-state`` lets them start it afresh."""
    lacking = sorted(str(about["client-state-missing"]) for about in info.values() if "client-state-missing" in about)
    if not lacking:
        return
    shown = "; ".join(lacking[:10]) + (f"; and {len(lacking) - 10} more" if len(lacking) > 10 else "")
    who = f"{counted(len(lacking), 'node')} {agreeing(len(lacking), 'lacks', 'lack')} the client state this checkpoint needs"
    if not cfg.allow_empty_client_state:
        raise ConfigError(f"{who}, so the resumed run would "
                          f"not continue the checkpointed one: {shown}. Resume from the client-state folder the run "
                          "wrote, or set allow-empty-client-state = true to start those clients' state afresh")
    log(WARNING, "%s and %s it afresh (allow-empty-client-state): %s", who, agreeing(len(lacking), "starts", "start"), shown)


def _build(run: _Run) -> tuple[Any, Sampler]:
    """The strategy the run config asks for (with a resumed run's state) and the run's sampler, which
    Flower's own strategies sample with too (``server_apps.seeded``)."""
    cfg, num_nodes = run.cfg, len(run.ranks)
    store_dir = str(run.out / "store") if cfg.store == "disk" else None
    if cfg.api == "message":
        strategy: Any = build_message_strategy(cfg, num_nodes, run.ranks, store_dir, run.unseen)
    else:
        strategy = build_legacy_strategy(cfg, run.initial, num_nodes, run.ranks, store_dir, run.instructions, run.unseen)
    server: MethodServer | None = getattr(strategy, "server", None)  # our strategies' server (none for Flower's own)
    if cfg.init == "independent" and server is not None:  # the config allows it only for methods that keep a model per client
        server.initial_by_rank = partial(initial_arrays, cfg)
    sampler = Sampler(cfg.seed, run.ranks)
    if run.resumed is not None:
        state = run.resumed.server_state(run.ranks)
        if server is not None and state is not None:
            server.initialize(run.initial)
            server.set_state(state)
        elif server is None:
            set_flower_state(strategy, run.resumed.flower_state())
        sampler.set_state(run.resumed.sampler_state())
        _continue_bmta(strategy, run.recorder.best_mean)
    return strategy, sampler


def _starting_arrays(run: _Run) -> dict[str, np.ndarray]:
    """The global arrays the first round of this process starts from: a resumed run's checkpointed ones
    (by name; legacy checkpoints keep positions only), else the initial model."""
    saved = run.resumed.arrays() if run.resumed is not None else None
    if saved is None:
        return run.initial
    return {k: saved[k] for k in run.initial} if set(saved) == set(run.initial) else dict(zip(run.initial, saved.values()))


def _train(run: _Run, strategy: Any, sampler: Sampler) -> Any:
    """The rounds this process has left, through the API the run config names, with the checkpoints and
    the records of every round; returns the final global arrays (``None``: the method has none)."""
    cfg, arrays = run.cfg, _starting_arrays(run)
    guard = ReplyGuard(ReplyBounds(**cfg.bounds())) if cfg.entry.builtin else None  # ours check their own replies
    if guard is not None and run.resumed is not None and (weights := run.resumed.guard_state(run.ranks)) is not None:
        guard.weights.set_state(weights)
    checkpointer = Checkpointer(run.out, cfg.checkpoint_every, strategy, run.recorder, cfg.to_run_config(), run.ranks,
                                run.layout, sampler, run.instructions[RUN_KEY], guard)
    remaining = cfg.num_rounds - run.offset
    new = NewClients(sampler, run.unseen, cfg.new_client_finetune_steps)
    if cfg.api == "message":
        flower_k = participants(cfg, len(run.ranks) - len(run.unseen)) if cfg.entry.builtin else None
        nodes = strategy.nodes if isinstance(getattr(strategy, "nodes", None), NodeWatch) else \
            NodeWatch(cfg.node_wait_timeout, lost_after=cfg.lost_node_rounds)  # ours watch their own nodes
        _account_failures(run, nodes.failures)
        wrapper: Any = RecordedStrategy(strategy, run.recorder, cfg.eval_every, sampler, flower_k, checkpointer, run.offset,
                                        guard=guard, max_idle_rounds=cfg.max_idle_rounds, nodes=nodes, new=new)
        if remaining > 0:
            wrapper.start(grid=run.grid, initial_arrays=numpy_record({k: np.asarray(v) for k, v in arrays.items()}),
                          num_rounds=remaining, train_config=ConfigRecord({**training_config(cfg), **run.instructions}),
                          evaluate_config=ConfigRecord(run.instructions))
        final = wrapper.arrays
    else:
        wrapper = RecordedLegacyStrategy(strategy, run.recorder, cfg.eval_every, sampler, checkpointer, run.offset,
                                         initial_parameters=ndarrays_to_parameters(list(arrays.values())),
                                         guard=guard, max_idle_rounds=cfg.max_idle_rounds,
                                         failures=getattr(strategy, "failures", None), new=new)  # Flower's own: it samples, none lost
        _account_failures(run, wrapper.failures)
        if remaining > 0:
            start_grid(grid=run.grid, strategy=wrapper, config=ServerConfig(num_rounds=remaining),
                       client_manager=SeededClientManager(sampler, new))
        final = wrapper.named()
    if remaining > 0 or run.resumed is None:
        checkpointer.save(cfg.num_rounds, final)
    return final


def _account_failures(run: _Run, failures: NodeFailures) -> None:
    """The run's failing clients: full reasons in ``failures.log``, the account in the summary."""
    failures.log_file = run.out / FAILURES
    if run.hosts:  # the strategies' ids are clients (``server_apps.client_grid``)
        failures.noun = "client"
        failures.hosts = run.grid.hosts  # type: ignore[attr-defined]  # the ClientGrid's, which nodes that join change
    run.recorder.failures = failures


def training_line(report: Mapping[str, Any]) -> str:
    """The console's line on how the run's clients trained and evaluated on nodes that host several
    (``ClientGrid.training_report``)."""
    line = (f"client trainings: {report['clients_trained_together']} with their round's clients as one computation, "
            f"{report['clients_trained_one_by_one']} one by one")
    reasons = report.get("one_by_one_because", {})
    line += "".join(f"; {n} one by one because {why}" for why, n in reasons.items())
    if "clients_evaluated_together" in report:
        line += (f". Client evaluations: {report['clients_evaluated_together']} together, "
                 f"{report['clients_evaluated_one_by_one']} one by one")
        line += "".join(f"; {n} one by one because {why}" for why, n in report.get("evaluated_one_by_one_because", {}).items())
    return line


def _finish(run: _Run, strategy: Any, final: Any) -> Path:
    """The models, the method's learned state, its diagnostics and the summary, written to the results folder."""
    cfg, out, server = run.cfg, run.out, getattr(strategy, "server", None)
    title = run_title(cfg, len(run.ranks))
    extra: dict[str, Any] = {}
    if server is not None:
        method = server.method
        if isinstance(method, PersonalizedAlgorithm) and isinstance(method.store, DiskClientModelStore):
            method.store.flush()  # the models stay in <results>/store (loading them all could exceed memory)
        elif isinstance(method, PersonalizedAlgorithm):  # what each client would use, a few clients' at a time
            ids = method.store.ids()
            rows = in_blocks(lambda part: method.models_for_evaluation(ids[part]), len(ids), len(method.initial))
            save_models(out / MODELS, ids, rows, method.initial)
        if learned := method.server_state():  # e.g. FedAttn's attention module
            save_state(out / SERVER_STATE, learned)
        try:
            extra = save_run_diagnostics(method, server.last_participants, run.info, out, title, figures=cfg.figures)
        except MissingExtra as err:  # the diagnostics' figures are optional
            log(WARNING, "flower-pfl: the diagnostics' figures are not drawn: %s", err)
    if hosts := run.hosts:  # nodes that host several clients
        extra["federation_nodes"] = len(set(hosts.values()))
    if run.unseen:
        extra["unseen_partition_ids"] = sorted(run.unseen)
    if groups := {str(i["partition-id"]): i[CLIENT_GROUP] for i in run.info.values() if CLIENT_GROUP in i}:
        extra["client_groups"] = dict(sorted(groups.items(), key=lambda kv: int(kv[0])))  # the domain, writer, ... of each client
    if (report := getattr(run.grid, "training_report", None)) is not None:  # nodes hosting several clients: how they ran
        extra.update(report())
        log(INFO, "flower-pfl: %s", training_line(extra))
    summary = run.recorder.finish(title=title, extra=extra)  # logs the closing block
    if cfg.verbose:
        log(INFO, "flower-pfl: summary %s", {k: round(v, 4) if isinstance(v, float) else v for k, v in summary.items()})
    if not summary.get("evaluated_rounds"):
        raise RunFailed(f"no client evaluation produced a finite accuracy in this run; see the log (results in {out})")
    return out
