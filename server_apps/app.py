"""The ServerApp: build the strategy the run config asks for, run it, write the results folder."""

from __future__ import annotations

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
from flower_pfl.diagnostics import label_set, save_similarity_snapshot, strongest_partner_agreement
from flower_pfl.results import RunRecorder
from flower_pfl.sampling import Sampler
from flower_pfl.server_step import MethodServer

from .factory import build_legacy_strategy, build_message_strategy, participants
from .node_order import RankedGrid, query_nodes
from .recording import RecordedLegacyStrategy, RecordedStrategy
from .seeded import SeededClientManager

app = ServerApp()


def run_dir(cfg: ExperimentConfig) -> Path:
    """A new folder ``<output-dir>/<method>-<dataset>-<model>-seed<seed>-<time>`` (relative paths from
    the current directory), with ``-2``, ``-3``, ... when runs start in the same second."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(cfg.output_dir).expanduser().resolve() / f"{cfg.label}-{cfg.dataset}-{cfg.model}-seed{cfg.seed}-{stamp}"
    base.parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, 10_000):
        path = base if n == 1 else base.with_name(f"{base.name}-{n}")
        try:
            path.mkdir()  # atomic: two runs never share a folder
            return path
        except FileExistsError:
            continue
    raise RuntimeError(f"cannot create a results folder next to {base}")


def _save_diagnostics(server: MethodServer, info: Mapping[int, Mapping[str, Any]], out: Path, method: str) -> dict[str, Any]:
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
        order = sorted(ids, key=lambda c: (labels[c], about(c).get("partition-id", -1)))
        attention.save_rounds(out / "attention_rounds")
        attention.save(out / "attention", title=f"{method}: mean attention over rounds", rank={c: i for i, c in enumerate(order)},
                       tick_labels={c: ",".join(map(str, labels[c])) for c in ids}, order="label set")
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
                                     [about(cid).get("dominant-label", -1) for cid in ids], title=method)
    return extra | {f"last_round_{k}": v for k, v in stats.items()}


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
    model = make_model(cfg, seed=cfg.seed)
    out = run_dir(cfg)
    recorder = RunRecorder(out, cfg.to_run_config(), cfg.num_rounds, log=lambda msg: log(INFO, "%s", msg))
    info = query_nodes(grid)
    ranks = {node: i["partition-id"] for node, i in info.items()}
    grid = RankedGrid(grid, ranks)  # type: ignore[assignment]
    num_nodes = len(list(grid.get_node_ids()))
    log(INFO, "flower-pfl: %s on %s (%s), %d nodes, results in %s", cfg.method, cfg.dataset, cfg.model, num_nodes, out)

    sampler = Sampler(cfg.seed, ranks)  # Flower's own strategies sample with it too (see server_apps.seeded)
    if cfg.api == "message":
        strategy = build_message_strategy(cfg, num_nodes, ranks)
        flower_k = participants(cfg, num_nodes) if cfg.entry.builtin else None
        RecordedStrategy(strategy, recorder, cfg.eval_every, sampler, flower_k).start(
            grid=grid,
            initial_arrays=ArrayRecord(model.state_dict()),
            num_rounds=cfg.num_rounds,
            train_config=ConfigRecord(solver_config(cfg)),
        )
    else:
        initial = {name: t.detach().cpu().numpy() for name, t in model.state_dict().items()}
        strategy = build_legacy_strategy(cfg, initial, num_nodes, ranks)
        start_grid(grid=grid, strategy=RecordedLegacyStrategy(strategy, recorder, cfg.eval_every, sampler),
                   config=ServerConfig(num_rounds=cfg.num_rounds), client_manager=SeededClientManager(sampler))

    server = getattr(strategy, "server", None)  # our strategies' server (none for Flower's own)
    if server is not None and getattr(server.method, "store", None) is not None:  # what each client would use
        ids = server.method.store.ids()
        torch.save({"ids": ids, "rows": server.method.models_for_evaluation(ids).cpu(), "initial": server.method.store.initial.cpu()},
                   out / "personalized_models.pt")
    if server is not None and (learned := server.method.server_state()):  # e.g. FedAttn's attention module
        torch.save(learned, out / "server_state.pt")
    extra = _save_diagnostics(server, info, out, cfg.method) if server is not None else {}
    summary = recorder.finish(title=f"{cfg.method} / {cfg.dataset} / {cfg.model}", extra=extra)
    log(INFO, "flower-pfl: summary %s", {k: round(v, 4) if isinstance(v, float) else v for k, v in summary.items()})
    log(INFO, "flower-pfl: results written to %s", out)
    if not summary.get("evaluated_rounds"):
        raise RuntimeError(f"no client evaluation succeeded in this run; see the log (results in {out})")
    return out
