"""The ServerApp: build the strategy the run config asks for, run it, write the results folder."""

from __future__ import annotations

import random
import time
from logging import ERROR, INFO
from pathlib import Path
from typing import Any, Mapping

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.common.logger import log
from flwr.server import ServerConfig
from flwr.server.compat import start_grid
from flwr.serverapp import Grid, ServerApp

from flower_pfl.config import ConfigError, ExperimentConfig
from flower_pfl.experiment import make_model, solver_config
from flower_pfl.diagnostics import save_similarity_snapshot
from flower_pfl.results import RunRecorder

from .factory import build_legacy_strategy, build_message_strategy
from .node_order import RankedGrid, query_nodes
from .recording import RecordedLegacyStrategy, RecordedStrategy

app = ServerApp()


def run_dir(cfg: ExperimentConfig) -> Path:
    """``<output-dir>/<method>-<dataset>-<model>-seed<seed>-<time>`` (relative paths from the current directory)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(cfg.output_dir).expanduser().resolve() / f"{cfg.method}-{cfg.dataset}-{cfg.model}-seed{cfg.seed}-{stamp}"


def _save_diagnostics(server: Any, labels: Mapping[int, int], out: Path, method: str) -> dict[str, Any]:
    """Attention heatmaps (clients grouped by dominant label) and, for FedACS, the last round's
    similarity and selection mask. Returns figures for the summary."""
    label_of = {key: labels.get(int(key), -1) for key in server.node_rank}  # legacy ids are strings
    by_label = {key: i for i, key in enumerate(sorted(server.node_rank, key=lambda k: (label_of[k], server.node_rank[k])))}
    if len(server.attention):
        server.attention.save(out / "attention", title=f"{method}: mean attention over rounds", rank=by_label or None)
    rule = server.rule
    if getattr(rule, "last_similarity", None) is None or not server.last_participants:
        return {}
    ids = server.last_participants
    stats = save_similarity_snapshot(out / "similarity_last_round", ids, rule.last_similarity.cpu().numpy(),
                                     rule.last_mask.cpu().numpy(), rule.last_delta,
                                     [label_of.get(cid, -1) for cid in ids], title=method)
    return {f"last_round_{k}": v for k, v in stats.items()}


@app.main()
def main(grid: Grid, context: Context) -> None:
    run_experiment(grid, context.run_config)


def run_experiment(grid: Grid, run_config: Mapping[str, Any]) -> Path:
    """Run the experiment ``run_config`` describes on ``grid``; returns the results folder."""
    try:
        cfg = ExperimentConfig.from_mapping(run_config)
    except ConfigError as err:
        log(ERROR, "%s", err)
        raise
    random.seed(cfg.seed)  # Flower's own strategies sample with `random`
    model = make_model(cfg, seed=cfg.seed)
    out = run_dir(cfg)
    recorder = RunRecorder(out, cfg.to_run_config(), cfg.num_rounds, log=lambda msg: log(INFO, "%s", msg))
    info = query_nodes(grid)
    ranks = {node: i["partition-id"] for node, i in info.items()}
    labels = {node: i.get("dominant-label", -1) for node, i in info.items()}
    grid = RankedGrid(grid, ranks)  # type: ignore[assignment]
    num_nodes = len(list(grid.get_node_ids()))
    log(INFO, "flower-pfl: %s on %s (%s), %d nodes, results in %s", cfg.method, cfg.dataset, cfg.model, num_nodes, out)

    if cfg.api == "message":
        strategy = build_message_strategy(cfg, num_nodes, ranks)
        RecordedStrategy(strategy, recorder, cfg.eval_every).start(
            grid=grid,
            initial_arrays=ArrayRecord(model.state_dict()),
            num_rounds=cfg.num_rounds,
            train_config=ConfigRecord(solver_config(cfg)),
        )
    else:
        initial = [t.detach().cpu().numpy() for t in model.state_dict().values()]
        strategy = build_legacy_strategy(cfg, initial, num_nodes, ranks)
        start_grid(grid=grid, strategy=RecordedLegacyStrategy(strategy, recorder, cfg.eval_every),
                   config=ServerConfig(num_rounds=cfg.num_rounds))

    server = getattr(strategy, "server", None)  # our strategies' per-client state
    if server is not None and server.store is not None:
        torch.save(server.store.state_dict(), out / "personalized_models.pt")
    extra = _save_diagnostics(server, labels, out, cfg.method) if server is not None else {}
    summary = recorder.finish(title=f"{cfg.method} / {cfg.dataset} / {cfg.model}", extra=extra)
    log(INFO, "flower-pfl: summary %s", {k: round(v, 4) if isinstance(v, float) else v for k, v in summary.items()})
    log(INFO, "flower-pfl: results written to %s", out)
    if not summary.get("evaluated_rounds"):
        raise RuntimeError(f"no client evaluation succeeded in this run; see the log (results in {out})")
    return out
