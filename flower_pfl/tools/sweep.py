"""Sweeps: run methods × settings × seeds, then report them as ``flower_pfl.tools.compare`` does.

    python -m flower_pfl sweep benchmarks/sweeps/fedacs_scarce.toml --workers 2
    python -m flower_pfl sweep --methods fedmcsa,fedacs,ditto --references local,fedavg \\
        --set dirichlet-alpha=0.1,0.5 --set partition=dirichlet --seeds 0,1,2 --out results/sweeps/alpha

``--set key=value`` fixes a run-config key for every cell; ``--set key=v1,v2`` makes it a grid
axis. Values are read as TOML values (``0.1``, ``true``, ``'dirichlet'``; a bare word is a string).
With a sweep file, ``--methods``, ``--seeds`` and ``--references`` replace its lists and ``--set``
adds to its base or grid. Every cell's run config is validated (``ExperimentConfig``) before
anything runs: an unknown key or a bad value stops the sweep with a ``ConfigError``.

A sweep file (TOML)::

    name = "alpha"                        # default: the file's name; output: results/sweeps/<name>
    methods = ["fedmcsa", "fedacs", "ditto"]
    seeds = [0, 1, 2]
    references = ["local", "fedavg"]      # run in every setting too (this is the default; [] for none)

    [base]                                # run-config keys every cell shares
    partition = "dirichlet"
    num-rounds = 200
    num-nodes = 100                       # the sweep's own key: how many clients (SuperNodes); default 100

    [grid]                                # every combination of these values is a setting
    dirichlet-alpha = [0.1, 0.5]

    [[settings]]                          # optional named settings (each combined with the grid)
    name = "cross-silo"
    partition = "shards"
    num-nodes = 10

    [method.ditto]                        # per-method run-config overrides
    ditto-lambda = 0.1

    [method."FedAvg+MCSA"]                # a named variant: a row of its own, with its method
    method = "fedavg"
    aggregation = "mcsa"

A method name ``a+b`` without a table means method ``a`` with aggregation ``b`` (``fedavg+mcsa``).
Precedence: base < setting < method table; ``seed`` and ``output-dir`` belong to the sweep.

Each cell runs into ``<out>/runs/<method>/<setting>/seed<k>/`` (a results folder inside, as
``server_apps.app.run_dir`` names it, ``cell.json`` saying what the cell is, and the run's console
output in ``run.log`` or ``flwr.log``). A cell whose
folder holds a completed ``summary.json`` with the same run config is not run again, so running
the command again continues an interrupted sweep (cells that failed or were killed are rerun).
Engines: ``inprocess`` (default: ``server_apps.inprocess.run_in_process`` in worker processes)
or ``flwr-run`` (each cell through ``flwr run`` on a local SuperLink with this sweep's own
``FLWR_HOME`` and ports, stopped by PID at the end). ``--workers N`` runs N cells at a time.

Outputs in ``<out>``: ``table.md``, ``table.csv``, ``curves.png`` (``flower_pfl.tools.compare``) and
``sweep.json`` (the sweep, every cell's run config, status, summary and folders relative to ``<out>``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from dataclasses import replace
from pathlib import Path
from typing import Any

from flower_pfl.engine.extras import require
from flower_pfl.experiment.config import ConfigError
from flower_pfl.run.results import SUMMARY
from flower_pfl.run.trackers import prepare_trackers
from flower_pfl.tools import compare
from flower_pfl.tools.sweep_flwr import FlwrRunEngine
from flower_pfl.tools.sweep_grid import (
    ENGINES,
    Cell,
    Sweep,
    SweepError,
    finished,
    from_toml,
    parse_set,
    unfinished_reason,
)


def run_cell_in_process(cell: Cell) -> dict[str, Any]:
    """One cell in this process (a worker of the pool), its console output in ``run.log`` in the
    cell's folder: ``{"status", "results_dir" | "error"}``."""
    import torch

    from server_apps.inprocess import run_in_process

    torch.set_num_threads(1)  # one core per worker
    log = cell.folder / "run.log"
    try:
        with _output_to(log):
            run_in_process(cell.run_config, num_clients=cell.num_nodes, num_nodes=cell.nodes_for(1))
    except Exception as err:
        return {"status": "failed", "error": f"{type(err).__name__}: {err} (log: {log})"}
    folder = finished(cell)
    return {"status": "completed", "results_dir": str(folder)} if folder else {"status": "failed", "error": f"{unfinished_reason(cell)} (log: {log})"}


@contextlib.contextmanager
def _output_to(path: Path) -> Iterator[None]:
    """This process's stdout and stderr (file descriptors 1 and 2: logs, warnings, prints) into ``path``."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with path.open("a") as fh:
        os.dup2(fh.fileno(), 1)
        os.dup2(fh.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


class Progress:
    """A progress bar over the whole sweep (cells done / total, ETA)."""

    def __init__(self, total: int, done: int, name: str) -> None:
        require("tqdm", why="the sweep's progress bar")
        from tqdm import tqdm

        self.bar = tqdm(total=total, initial=done, desc=name, unit="run", file=sys.stderr, dynamic_ncols=True)
        self.failed = 0

    def update(self, cell: Cell, result: Mapping[str, Any]) -> None:
        if result["status"] != "completed":
            self.failed += 1
            self.bar.write(f"failed: {cell.method} / {cell.setting} / seed {cell.seed}: {result.get('error')}")
        self.bar.set_postfix_str(f"{cell.method}, {cell.setting}, seed {cell.seed}" + (f"; {self.failed} failed" if self.failed else ""))
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def run(sweep: Sweep, out: str | Path, engine: str = "inprocess", workers: int = 1, app: Path | None = None,
        progress: bool = True) -> dict[str, Any]:
    """Run the cells not finished yet, then write ``sweep.json`` and the report; returns sweep.json's content."""
    if engine not in ENGINES:
        raise SweepError(f"engine {engine!r} is invalid: must be one of {', '.join(ENGINES)}")
    if workers < 1:
        raise SweepError(f"workers = {workers} is invalid: must be >= 1")
    out = Path(out).resolve()
    cells = sweep.cells(out)
    t0 = time.time()
    results: dict[int, dict[str, Any]] = {}
    for i, cell in enumerate(cells):
        if (folder := finished(cell)) is not None:
            results[i] = {"status": "completed", "results_dir": str(folder), "skipped": True}
    todo = [i for i in range(len(cells)) if i not in results]
    for cell in cells:  # what the cell is, beside its results (compare reads it)
        cell.folder.mkdir(parents=True, exist_ok=True)
        (cell.folder / compare.CELL).write_text(json.dumps(cell.describe(), indent=2))
    prepare_trackers([cells[i].run_config for i in todo])
    bar = Progress(len(cells), len(cells) - len(todo), sweep.name) if progress else None
    try:
        with _executor(engine, workers, out, app) as (pool, task):
            futures = {pool.submit(task, cells[i]): i for i in todo}
            for future in as_completed(futures):
                i = futures[future]
                try:
                    results[i] = future.result()
                except Exception as err:
                    results[i] = {"status": "failed", "error": f"{type(err).__name__}: {err}"}
                if bar:
                    bar.update(cells[i], results[i])
    finally:
        if bar:
            bar.close()
    record = {"sweep": sweep.to_dict(), "engine": engine, "workers": workers, "wall_time_s": time.time() - t0,
              "settings": [{"name": n, "values": v} for n, v in sweep.setting_list()],
              "cells": [{**cell.describe(), "run_config": cell.run_config, **results[i], **_relative(results[i], out),
                         "cell_dir": str(cell.folder.relative_to(out)), "summary": _summary(results[i])}
                        for i, cell in enumerate(cells)]}
    (out / compare.SWEEP).write_text(json.dumps(record, indent=2, default=str))
    runs = compare.load_sweep(out)
    if runs:
        compare.report(runs, out)
    return record


def _relative(result: Mapping[str, Any], out: Path) -> dict[str, str]:
    """The results folder relative to the sweep folder (sweep.json stays valid when the folder moves)."""
    return {"results_dir": str(Path(result["results_dir"]).relative_to(out))} if result.get("results_dir") else {}


def _summary(result: Mapping[str, Any]) -> dict[str, Any] | None:
    path = Path(result["results_dir"]) / SUMMARY if result.get("results_dir") else None
    return json.loads(path.read_text()) if path and path.exists() else None


class _executor:
    """``(pool, task)`` for an engine: processes for in-process runs, threads around ``flwr run``."""

    def __init__(self, engine: str, workers: int, out: Path, app: Path | None) -> None:
        self.engine, self.workers, self.out, self.app = engine, workers, out, app
        self.pool: Executor | None = None
        self.flwr: Any = None

    def __enter__(self) -> tuple[Executor, Callable[[Cell], dict[str, Any]]]:
        if self.engine == "inprocess":
            self.pool = ProcessPoolExecutor(max_workers=self.workers)
            return self.pool, run_cell_in_process

        self.flwr = FlwrRunEngine(self.out / ".flwr-home", self.app)
        self.pool = ThreadPoolExecutor(max_workers=self.workers)
        return self.pool, self.flwr.run_cell

    def __exit__(self, *exc: Any) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
        if self.flwr is not None:
            self.flwr.stop()


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m flower_pfl sweep", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file", nargs="?", type=Path, help="a sweep file (TOML)")
    ap.add_argument("--methods", help="comma-separated methods (replaces the file's)")
    ap.add_argument("--seeds", help="comma-separated seeds (replaces the file's)")
    ap.add_argument("--references", help="comma-separated reference methods run in every setting ('' for none)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=V[,V...]", help="a base value, or a grid axis")
    ap.add_argument("--out", type=Path, help="the sweep folder (default with a file: results/sweeps/<name>)")
    ap.add_argument("--engine", choices=ENGINES, default="inprocess")
    ap.add_argument("--workers", type=int, default=1, help="cells run at the same time")
    ap.add_argument("--app", type=Path, default=None, help="flwr-run: the Flower app folder (default: this project's)")
    ap.add_argument("--dry-run", action="store_true", help="list the cells (and which are done) without running")
    return ap


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    try:
        sweep = _sweep_from_args(args)
        out = args.out or (Path("results") / "sweeps" / sweep.name if args.file else None)
        if out is None:
            raise SweepError("--out is needed without a sweep file")
        if args.dry_run:
            for cell in sweep.cells(out):
                print(f"{'done' if finished(cell) else 'todo'}  {cell.method:16s} {cell.setting:30s} seed {cell.seed}")
            return
        record = run(sweep, out, args.engine, args.workers, args.app)
    except ConfigError as err:
        raise SystemExit(f"error: {err}") from None
    table = Path(out) / "table.md"
    print(table.read_text() if table.exists() else "no completed cell")
    failed = [c for c in record["cells"] if c["status"] != "completed"]
    skipped = sum(1 for c in record["cells"] if c.get("skipped"))
    print(f"\n{len(record['cells']) - len(failed)}/{len(record['cells'])} cells completed ({skipped} earlier), this time in "
          f"{record['wall_time_s']:.0f} s; results in {out}")
    if failed:
        raise SystemExit(f"{len(failed)} cell(s) failed; run the command again to retry them")


def _sweep_from_args(args: argparse.Namespace) -> Sweep:
    def names(text: str) -> list[str]:
        return [t.strip() for t in text.split(",") if t.strip()]

    base, grid = parse_set(args.set)
    if args.file is not None:
        sweep = from_toml(args.file)
        changes: dict[str, Any] = {  # a key given on the command line leaves the file's base or grid
            "base": {k: v for k, v in sweep.base.items() if k not in grid} | base,
            "grid": {k: v for k, v in sweep.grid.items() if k not in base} | grid}
    elif args.methods is None:
        raise SweepError("give a sweep file or --methods")
    else:
        sweep, changes = None, {"base": base, "grid": grid, "seeds": [0], "references": []}
    if args.methods is not None:
        changes["methods"] = names(args.methods)
    if args.seeds is not None:
        try:
            changes["seeds"] = [int(s) for s in names(args.seeds)]
        except ValueError:
            raise SweepError(f"--seeds {args.seeds!r}: expected comma-separated integers") from None
    if args.references is not None:
        changes["references"] = names(args.references)
    if sweep is None:
        return Sweep(**changes, name=args.out.name if args.out else "sweep")
    # the file's [method.X] tables were checked against its own lists; those of methods left out here are dropped
    kept = {*changes.get("methods", sweep.methods), *changes.get("references", sweep.references)}
    changes["method_tables"] = {k: v for k, v in sweep.method_tables.items() if k in kept}
    return replace(sweep, **changes)


if __name__ == "__main__":
    main()
