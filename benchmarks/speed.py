"""Where a round's time goes: the in-process grid against ``flwr run``, measured side by side.

    python -m benchmarks.speed                       # FedAvg, Ditto, FedMCSA, Local; about 20 min on 2 cores
    python -m benchmarks.speed --methods fedmcsa --skip-aggregation   # the quick start's method
    python -m benchmarks.speed --methods fedavg --federation client-resources-num-cpus=2

For each method, on Synthetic(0.5, 0.5) with 100 clients, 20 per round, 20 local steps of 20
samples and every client evaluated every 5 rounds, it prints:

- the steady seconds per round (rounds 6-25: four evaluations in twenty rounds) of the package's
  ServerApp and ClientApp run in one process (``server_apps.inprocess``, one torch thread: one node
  hosting the 100 clients, whose round is one computation, and 100 nodes of one client, each trained
  alone) and through ``flwr run`` (a local SuperLink of its own, Ray-backed virtual nodes: 100 nodes of
  one client, and one node per core hosting the clients in blocks, ``--nodes``);
- where the ``flwr run`` round's time goes, measured by timers around the package's own code in
  every process (``benchmarks/speed_probe.py``): the ServerApp's own work, pushing messages into
  and pulling replies out of Flower's LinkState, Flower's polling before a message reaches an actor
  and after its reply leaves it, Ray's dispatch and (de)serialisation, and the ClientApp's set-up,
  array loading, training, evaluation and reply;
- start-up: seconds from ``flwr run`` to the SuperLink, the run's first line and the first round;
- every server aggregation against the two-GEMM limit (``benchmarks.aggregation_speed``).

``--out DIR`` also writes ``table.md`` and ``results.json`` there.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from client_apps.flower_internals import parse_config_args
from flower_pfl.experiment.config import ExperimentConfig
from flower_pfl.tools.sweep import Cell
from flower_pfl.tools.sweep_flwr import PROJECT, RESOURCES, FlwrRunEngine

from . import speed_probe
from .common import publish

#: the setting of every measurement (the quick start's default experiment, 26 rounds)
SETTING = {"dataset": "synthetic", "model": "mlr", "clients-per-round": 20, "local-steps": 20, "batch-size": 20,
           "eval-every": 5, "num-rounds": 26, "checkpoint-every": 10}
NUM_NODES = 100
WINDOW = (6, 25)  # steady rounds: after the first evaluation, four evaluations in twenty rounds
#: what ``flwr run`` prints, in order, with the name of the moment it marks
MILESTONES = (("superlink", "Using SuperLink"), ("run submitted", "Successfully started run"),
              ("app installed", "Successfully installed"), ("nodes answered", r"flower-pfl: \S+ on "),
              ("round 1", r"round +1/"))
PARTS = ("serverapp", "push", "dispatch wait", "ray", "setup", "load", "train", "evaluate", "reply",
         "actors idle", "reply wait")


def run_config(method: str, out: Path, nodes: int = NUM_NODES) -> dict[str, Any]:
    """The setting's run config for ``nodes`` nodes hosting the ``NUM_NODES`` clients."""
    return {**ExperimentConfig().to_run_config(), **SETTING, "method": method, "output-dir": str(out),
            "num-clients": 0 if nodes == NUM_NODES else NUM_NODES}


def in_process(method: str, work: Path, nodes: int = 1) -> dict[str, Any]:
    """One in-process run of the package's apps (timed) on ``nodes`` nodes, analysed."""
    import logging

    import torch

    from server_apps.inprocess import in_process_grid

    logging.getLogger("flwr").setLevel(logging.WARNING)  # the run's own lines; flwr run's are in its log
    timings = work / f"inprocess-{nodes}-{method}"
    timings.mkdir(parents=True)
    os.environ[speed_probe.TIMINGS] = str(timings)
    torch.set_num_threads(1)
    config = run_config(method, work / "results", nodes)
    try:
        speed_probe.run_timed(in_process_grid(speed_probe.clientapp, nodes, config), config)  # type: ignore[arg-type]
    finally:
        del os.environ[speed_probe.TIMINGS]
    return speed_probe.analyse(speed_probe.read(timings), *WINDOW)


def module_app(app: Path, module: Path) -> Path:
    """A Flower app folder ``app`` running the ``serverapp`` and ``clientapp`` of the file ``module`` (copied
    in): the project's ``pyproject.toml`` (its run config) with the components pointed at them."""
    app.mkdir(parents=True, exist_ok=True)
    text = (PROJECT / "pyproject.toml").read_text()
    text = re.sub(r'serverapp = ".*"', f'serverapp = "{module.stem}:serverapp"', text)
    text = re.sub(r'clientapp = ".*"', f'clientapp = "{module.stem}:clientapp"', text)
    text = re.sub(r"fab-include = \[.*\]", f'fab-include = ["{module.name}"]', text)  # the package comes installed
    (app / "pyproject.toml").write_text(text)
    shutil.copy(module, app / module.name)
    return app


def timed_app(work: Path) -> Path:
    """A Flower app running the package's apps inside ``speed_probe``'s timers (``module_app``)."""
    return module_app(work / "timed_app", Path(__file__).with_name("speed_probe.py"))


def timed_engine(home: Path, app: Path, federation: Mapping[str, Any]) -> FlwrRunEngine:
    """An engine whose SuperLink (started by its first run, with the environment of that moment) has
    its processes write their timings into ``home/timings``."""
    engine = FlwrRunEngine(home, app=app, federation=federation)
    (home / "timings").mkdir()
    engine.env[speed_probe.TIMINGS] = str(home / "timings")
    return engine


def flwr_run(engine: FlwrRunEngine, method: str, work: Path, label: str, nodes: int = NUM_NODES) -> dict[str, Any]:
    """One ``flwr run`` of the timed app on ``nodes`` virtual nodes: its milestones (seconds since the command
    started) and the analysis of its timings."""
    timings = work / f"flwr-{label}-{method}"
    timings.mkdir(parents=True)
    written = Path(engine.env[speed_probe.TIMINGS])  # the SuperLink's processes keep the folder they started with
    cell = Cell(method, label, 0, run_config(method, work / "results", nodes), NUM_NODES, timings, nodes=nodes)
    seen: dict[str, float] = {}
    t0 = time.time()
    with subprocess.Popen(engine.command(cell), cwd=engine.app, env=engine.env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as proc, (timings / "flwr.log").open("w") as log:
        for line in proc.stdout:  # type: ignore[union-attr]
            log.write(line)
            for name, pattern in MILESTONES:
                if name not in seen and re.search(pattern, line):
                    seen[name] = time.time() - t0
    for path in written.glob("*.jsonl"):  # this run's processes have ended: their lines are complete
        path.rename(timings / path.name)
    rows = speed_probe.read(timings)
    result = speed_probe.analyse(rows, *WINDOW)
    run = result["run"] or {}
    seen["serverapp started"] = run.get("start", t0) - t0
    processes, handlers = ([r["start"] for r in rows if r["row"] == kind] for kind in ("process", "handler"))
    if processes and handlers:  # inside the nodes' query: Ray and its actors starting
        seen["first message to Ray"], seen["first message in a ClientApp"] = min(processes) - t0, min(handlers) - t0
    return {**result, "startup": dict(sorted(seen.items(), key=lambda kv: kv[1])), "command_s": time.time() - t0}


def breakdown_table(columns: Mapping[str, Mapping[str, Any]]) -> str:
    """Rows: the parts of a round (ms per round); columns: runs."""
    names = list(columns)
    lines = ["| ms per round | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for part in PARTS:
        values = [columns[n]["parts"].get(part) for n in names]
        if any(v for v in values):
            lines.append(f"| {part} | " + " | ".join("" if v is None else f"{1e3 * v:.0f}" for v in values) + " |")
    lines.append("| **round** | " + " | ".join(f"**{1e3 * columns[n]['seconds_per_round']:.0f}**" for n in names) + " |")
    lines.append("| looking for replies (meanwhile) | " + " | ".join(f"{1e3 * columns[n].get('pull_per_round', 0.0):.0f}" for n in names) + " |")
    lines.append("| CPU: ClientApp handlers | " + " | ".join(f"{1e3 * columns[n]['client_cpu_per_round']:.0f}" for n in names) + " |")
    lines.append("| CPU: ServerApp thread | " + " | ".join(f"{1e3 * columns[n]['server_cpu_per_round']['serverapp thread']:.0f}" for n in names) + " |")
    lines.append("| CPU: ServerApp's process | " + " | ".join(f"{1e3 * columns[n]['server_cpu_per_round']['process']:.0f}" for n in names) + " |")
    return "\n".join(lines)


def render(results: Mapping[str, Any]) -> str:
    """The tables of a ``results.json``: seconds per round, the breakdown, the aggregation."""
    lines = ["| method | run | s/round | × in-process | first round done after |", "|---|---|---:|---:|---:|"]
    for method, runs in results["methods"].items():
        base = runs["in-process"]["seconds_per_round"]
        for name, run in runs.items():
            first = f"{run['startup']['round 1']:.1f} s" if "round 1" in run.get("startup", {}) else ""
            lines.append(f"| {method} | {name} | {run['seconds_per_round']:.3f} | {run['seconds_per_round'] / base:.2f} | {first} |")
    columns = {f"{m} {k}": r for m, runs in results["methods"].items() for k, r in runs.items()}
    table = "\n".join(lines) + "\n\n" + breakdown_table(columns)
    if results.get("aggregation"):
        from .aggregation_speed import format_table

        table += "\n\n" + format_table(results["aggregation"])
    return table


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", nargs="+", default=["fedavg", "ditto", "fedmcsa", "local"])
    parser.add_argument("--federation", nargs="*", default=[f"{k}={v}" for k, v in RESOURCES.items()],
                        help="--federation-config entries of the flwr runs (default: the quick start's, %(default)s)")
    parser.add_argument("--flower-default", action="store_true",
                        help="also run the first method under Flower's default resources (2 CPUs per virtual client)")
    parser.add_argument("--skip-aggregation", action="store_true", help="leave out the aggregation table")
    parser.add_argument("--nodes", type=int, default=os.cpu_count() or 1,
                        help="the nodes of the fast flwr run layout, each hosting a block of the clients (default: one per core)")
    parser.add_argument("--out", type=Path, help="also write table.md and results.json here")
    parser.add_argument("--keep", action="store_true", help="keep the runs' timings, logs and results folders (printed at the end)")
    args = parser.parse_args(argv)
    federation = parse_config_args(args.federation)  # as flwr run reads --federation-config
    load = os.getloadavg()[0]
    print(f"# flower-pfl speed: {os.cpu_count()} cores, load {load:.2f} at the start\n", flush=True)
    work = Path(tempfile.mkdtemp(prefix="flower-pfl-speed-"))
    engine = timed_engine(work / "flwr-home", timed_app(work), federation)
    results: dict[str, Any] = {"federation": federation, "setting": SETTING, "methods": {}}
    engines = [engine]
    try:
        for method in args.methods:
            inproc = in_process(method, work)
            runs = {"in-process": inproc, f"in-process, {NUM_NODES} nodes": in_process(method, work, NUM_NODES),
                    f"flwr run, {args.nodes} nodes": flwr_run(engine, method, work, "fast", args.nodes),
                    f"flwr run, {NUM_NODES} nodes": flwr_run(engine, method, work, "flwr")}
            if args.flower_default and method == args.methods[0]:
                engines.append(timed_engine(work / "flwr-home-default", engine.app, {}))
                runs["flwr run, Flower's default resources"] = flwr_run(engines[-1], method, work, "default")
            results["methods"][method] = runs
            for name, run in runs.items():
                print(f"{method}, {name}: {run['seconds_per_round']:.3f} s/round ({run['seconds_per_round'] / inproc['seconds_per_round']:.2f}x)"
                      + (f"; Ray per message {run['ray_ms']}, torch threads {run['torch_threads']}, start-up "
                         + ", ".join(f"{k} {v:.1f}" for k, v in run["startup"].items()) + " s" if "startup" in run else ""), flush=True)
    finally:
        for e in engines:
            e.stop()
    if not args.skip_aggregation:
        from .aggregation_speed import aggregation_table

        results["aggregation"] = aggregation_table()
    table = render(results)
    end_load = os.getloadavg()[0]
    table += f"\n\n{os.cpu_count()} cores; load {load:.2f} at the start, {end_load:.2f} at the end; flwr run federation {federation or 'defaults'}"
    publish(table, results, args.out, work, args.keep, "timings, logs and results")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
