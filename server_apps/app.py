"""The ServerApp: build the strategy the run config asks for, run it, write the results folder."""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping
from functools import partial
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context
from flwr.common import ndarrays_to_parameters
from flwr.common.logger import log
from flwr.server import ServerConfig
from flwr.server.compat import start_grid
from flwr.serverapp import Grid, ServerApp
from flwr.superlink.grid.inmemory_grid import InMemoryGrid

from flower_pfl.client_step import RESUMED_AFTER, RUN_KEY
from flower_pfl.config import ConfigError, ExperimentConfig
from flower_pfl.diagnostics import label_set, save_similarity_snapshot, strongest_partner_agreement
from flower_pfl.experiment import check_device, has_hidden_layers, initial_arrays, solver_config
from flower_pfl.figures import grouped_order, run_title
from flower_pfl.quiet import silence_runtime_noise
from flower_pfl.reply_checks import ReplyBounds
from flower_pfl.results import MODELS, SERVER_STATE, RunFailed, RunRecorder, save_models, save_state
from flower_pfl.sampling import Sampler
from flower_pfl.server_step import MethodServer
from flower_pfl.store import DiskClientModelStore
from strategies.metrics import PersonalizedMetrics
from strategies.nodes import NodeWatch

from .checkpointing import Checkpointer, Resumption, set_flower_state
from .console import quiet_round_loop
from .factory import build_legacy_strategy, build_message_strategy, participants
from .guard import ReplyGuard
from .node_order import RankedGrid, query_nodes
from .recording import RecordedLegacyStrategy, RecordedStrategy
from .seeded import SeededClientManager

silence_runtime_noise()  # before Ray starts in a simulation (flower_pfl.quiet)
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


def _save_diagnostics(server: MethodServer, info: Mapping[int, Mapping[str, Any]], out: Path, title: str) -> dict[str, Any]:
    """Attention heatmaps averaged over rounds (clients ordered by their label set, then partition
    id) with how often each client's strongest attention falls on a client with the same labels,
    and, for FedACS, the last round's similarity and selection mask. Returns figures for the summary."""
    def about(key: Any) -> Mapping[str, Any]:
        return info.get(int(key), {})

    extra: dict[str, Any] = {}
    attention = getattr(server.method, "attention_weights", None)
    if attention is not None and len(attention):
        ids = attention.clients
        labels = {cid: label_set(about(cid).get("label-counts", [])) for cid in ids}
        order = [ids[i] for i in grouped_order([labels[c] for c in ids], [about(c).get("partition-id", -1) for c in ids])]
        attention.save_rounds(out / "attention_rounds")
        attention.save(out / "attention", title=title, rank={c: i for i, c in enumerate(order)}, groups=labels)
        ordered, means = attention.mean({c: i for i, c in enumerate(order)})
        for name, mean in means.items():
            stats = strongest_partner_agreement(mean, [labels[c] for c in ordered])
            extra[f"attention_{name}_strongest_same_labels"] = stats["strongest_same_group"]
            extra[f"attention_{name}_chance_same_labels"] = stats["chance_same_group"]
    method_state = server.method
    if getattr(method_state, "last_similarity", None) is None or not server.last_participants:
        return extra
    ids = server.last_participants
    stats = save_similarity_snapshot(out / "similarity_last_round", ids, method_state.last_similarity.cpu().numpy(),
                                     method_state.last_mask.cpu().numpy(), method_state.last_delta,
                                     [about(cid).get("dominant-label", -1) for cid in ids], title=title)
    return extra | {f"last_round_{k}": v for k, v in stats.items()}


#: seconds between a simulation's looks for replies (``flwr run``: Flower's in-memory grid, 0.1 s by default)
PULL_INTERVAL = 0.01


def poll_faster(grid: Grid) -> None:
    """Let ``flwr run``'s in-memory grid look for replies every ``PULL_INTERVAL`` seconds instead of
    Flower's 0.1: a round no longer waits about 50 ms after its last reply (``benchmarks/speed.py``
    measures it). Other grids (a SuperLink's, the in-process one) are left as they are."""
    if isinstance(grid, InMemoryGrid) and grid.pull_interval > PULL_INTERVAL:
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
    unless ``verbose`` (``flower_pfl.quiet``): the run's own progress lines say how it goes."""
    try:
        cfg = ExperimentConfig.from_mapping(run_config)
    except ConfigError as err:
        log(ERROR, "%s", err)
        raise
    with quiet_round_loop(enabled=not cfg.verbose):
        return _run_experiment(grid, cfg)


def _run_experiment(grid: Grid, cfg: ExperimentConfig) -> Path:
    try:
        check_device(cfg.device)
        resumed = Resumption(cfg.resume_from) if cfg.resume_from else None
    except ConfigError as err:
        log(ERROR, "%s", err)
        raise
    initial = initial_arrays(cfg)
    if cfg.init == "zero" and has_hidden_layers(initial):
        log(WARNING, "init = 'zero' with model '%s': zero weights cannot break the symmetry of its hidden units (with "
            "every weight at zero they get no gradient at all: the model learns only its output bias); use init 'shared' "
            "or 'independent'", cfg.model)
    if cfg.init == "zero" and cfg.max_update_ratio > 0:
        log(WARNING, "init = 'zero' with max-update-ratio = %g: a client sent a near-zero model may have its honest update "
            "refused (the bound is relative to the norm of the model sent); max-update-ratio = 0 turns it off", cfg.max_update_ratio)
    layout = {name: list(a.shape) for name, a in initial.items()}
    settings = cfg.to_run_config()
    if resumed is not None:
        try:
            resumed.check(settings, layout)
            if cfg.store == "disk":
                raise ConfigError("run config 'resume-from' needs store = 'memory': a disk store is not rolled back to its "
                                  "checkpoint, so the resumed run would not continue from the checkpointed round")
        except ConfigError as err:
            log(ERROR, "%s", err)
            raise
    try:  # every node loads its data to answer: what they cannot serve fails before the results folder exists
        info = query_nodes(grid)
        out = resumed.folder if resumed is not None else run_dir(cfg)
    except ConfigError as err:
        log(ERROR, "%s", err)
        raise
    if resumed is not None:
        recorder = RunRecorder.resume(out, cfg.num_rounds, resumed.round, resumed.meta["elapsed"], log=lambda msg: log(INFO, "%s", msg))
        log(INFO, "flower-pfl: resuming %s after round %d", out, resumed.round)
    else:
        recorder = RunRecorder(out, settings, cfg.num_rounds, log=lambda msg: log(INFO, "%s", msg))
    offset = resumed.round if resumed is not None else 0
    ranks = {node: i["partition-id"] for node, i in info.items()}
    grid = RankedGrid(grid, ranks)  # type: ignore[assignment]
    num_nodes = len(list(grid.get_node_ids()))
    log(INFO, "flower-pfl: %s on %s (%s), %d nodes, %d rounds, evaluation every %d; results in %s", cfg.label, cfg.dataset,
        cfg.model, num_nodes, cfg.num_rounds, cfg.eval_every, out)

    sampler = Sampler(cfg.seed, ranks)  # Flower's own strategies sample with it too (see server_apps.seeded)
    store_dir = str(out / "store") if cfg.store == "disk" else None
    # every instruction names the run (clients keep their state under that name) and, when resumed, the round
    run_key = resumed.meta["run-key"] if resumed is not None else f"{out.name}-{secrets.token_hex(4)}"  # unique per run
    instructions: dict[str, Any] = {RUN_KEY: run_key} | ({RESUMED_AFTER: resumed.round} if resumed is not None else {})
    if cfg.api == "message":
        strategy: Any = build_message_strategy(cfg, num_nodes, ranks, store_dir)
    else:
        strategy = build_legacy_strategy(cfg, initial, num_nodes, ranks, store_dir, instructions)
    server = getattr(strategy, "server", None)  # our strategies' server (none for Flower's own)
    if cfg.init == "independent":  # the config allows it only for methods that keep a model per client
        server.initial_by_rank = partial(initial_arrays, cfg)
    arrays = initial
    if resumed is not None:
        if server is not None:
            server.initialize(initial)
            server.set_state(resumed.server_state(ranks))
        else:
            set_flower_state(strategy, resumed.flower_state())
        saved = resumed.arrays()
        if saved is not None:  # by name; legacy checkpoints keep positions only
            arrays = {k: saved[k] for k in initial} if set(saved) == set(initial) else dict(zip(initial, saved.values()))
        sampler.set_state(resumed.sampler_state())
        _continue_bmta(strategy, recorder.best_mean)
    checkpointer = Checkpointer(out, cfg.checkpoint_every, strategy, recorder, settings, ranks, layout, sampler, run_key)
    remaining = cfg.num_rounds - offset
    guard = ReplyGuard(ReplyBounds(**cfg.bounds())) if cfg.entry.builtin else None  # ours check their own replies
    if cfg.api == "message":
        flower_k = participants(cfg, num_nodes) if cfg.entry.builtin else None
        wrapper: Any = RecordedStrategy(strategy, recorder, cfg.eval_every, sampler, flower_k, checkpointer, offset,
                                        guard=guard, max_idle_rounds=cfg.max_idle_rounds, nodes=NodeWatch(cfg.node_wait_timeout))
        if remaining > 0:
            wrapper.start(grid=grid, initial_arrays=ArrayRecord({k: Array(np.asarray(v)) for k, v in arrays.items()}),
                          num_rounds=remaining, train_config=ConfigRecord({**solver_config(cfg), **instructions}),
                          evaluate_config=ConfigRecord(instructions))
        final = wrapper.arrays
    else:
        wrapper = RecordedLegacyStrategy(strategy, recorder, cfg.eval_every, sampler, checkpointer, offset,
                                         initial_parameters=ndarrays_to_parameters(list(arrays.values())),
                                         guard=guard, max_idle_rounds=cfg.max_idle_rounds)
        if remaining > 0:
            start_grid(grid=grid, strategy=wrapper, config=ServerConfig(num_rounds=remaining),
                       client_manager=SeededClientManager(sampler))
        final = wrapper.named()
    if remaining > 0 or resumed is None:
        checkpointer.save(cfg.num_rounds, final)

    if server is not None and isinstance(getattr(server.method, "store", None), DiskClientModelStore):
        server.method.store.flush()  # the models stay in <results>/store (loading them all could exceed memory)
    elif server is not None and getattr(server.method, "store", None) is not None:  # what each client would use
        ids = server.method.store.ids()
        save_models(out / MODELS, ids, server.method.models_for_evaluation(ids), server.method.store.initial)
    if server is not None and (learned := server.method.server_state()):  # e.g. FedAttn's attention module
        save_state(out / SERVER_STATE, learned)
    title = run_title(cfg, num_nodes)
    extra = _save_diagnostics(server, info, out, title) if server is not None else {}
    summary = recorder.finish(title=title, extra=extra)  # logs the closing block
    if cfg.verbose:
        log(INFO, "flower-pfl: summary %s", {k: round(v, 4) if isinstance(v, float) else v for k, v in summary.items()})
    if not summary.get("evaluated_rounds"):
        raise RunFailed(f"no client evaluation produced a finite accuracy in this run; see the log (results in {out})")
    return out
