"""Flower's own floor under ``flwr run`` beside the package's round, and a compute-heavy workload, on
one machine in one invocation.

    python -m benchmarks.flwr_floor                          # about 5 minutes on 2 cores
    python -m benchmarks.flwr_floor --skip-cnn --flower-pull # the floor (also at Flower's pull interval) and the quick start: 2 minutes

Every ``flwr run`` here uses one local SuperLink of the benchmark's own (``FlwrRunEngine``) and 2 virtual
nodes, ``client-resources-num-cpus=1``; every in-process run the package's in-process grid with the same
2 nodes and one torch thread. It prints:

1. **Flower's floor**: a Flower app whose ClientApp answers at once (``benchmarks/flower_floor_app.py``)
   and whose ServerApp runs Flower's ``FedAvg`` (``Strategy.start``) on an MLR-sized model for 26 rounds,
   steady seconds per round over rounds 6-25 from the rounds' end times, with every node trained each round
   and evaluated never (``fraction_evaluate=0``: one exchange a round) or every round (two exchanges); the
   messages each kind of exchange sent, counted in the ClientApp. The floor of the package's schedule (a
   training exchange every round, an evaluation exchange every 5th) is ``train + (train_eval - train) / 5``.
   The ServerApp looks for replies every ``server_apps.app.PULL_INTERVAL`` seconds, as the package's does
   (``--flower-pull``: also at Flower's own 0.1 s).
2. **The package** on the README's quick start (``benchmarks.speed.SETTING``, FedMCSA, 100 clients on the
   2 nodes), in process and under ``flwr run``, untimed: steady seconds per round (rounds 6-25) from the
   run's ``metrics.jsonl``; what it adds on top of Flower's floor for its schedule.
3. **A compute-heavy workload**: the 4-layer CNN (``model = "cnn"``) on CIFAR-100's files with random
   pixels (``--images`` of them, ``benchmarks.client_speed.write_cifar100``), Dirichlet label skew, FedAvg,
   100 clients on the 2 nodes, 20 a round, 20 local steps of 20 samples, every client evaluated every 5
   rounds, ``--cnn-rounds`` rounds (steady: rounds 3 onwards), in process and under ``flwr run``. The
   ``flwr run`` processes read the written files through ``benchmarks/written_data_app.py`` (torchvision
   checks CIFAR's md5 sums, which random pixels cannot match; the app's module checks that they exist, as
   ``written_cifar`` does in this process).

``--out DIR`` writes ``table.md`` and ``results.json`` there.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from statistics import median
from typing import Any

from flower_pfl.tools.sweep import Cell
from flower_pfl.tools.sweep_flwr import RESOURCES, FlwrRunEngine
from server_apps.app import PULL_INTERVAL

from . import client_speed, speed
from .common import publish

NODES = 2
FLOOR_ROUNDS = 26
METHOD = "fedmcsa"  # the quick start's
#: the package's schedule: an evaluation exchange every ``EVAL_EVERY`` rounds
EVAL_EVERY = int(speed.SETTING["eval-every"])  # type: ignore[call-overload]
HERE = Path(__file__).resolve().parent

FLOOR_PYPROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "flower-floor"
version = "1.0.0"
description = "A ClientApp that answers at once and Flower's FedAvg: what a round costs Flower itself"
dependencies = ["flwr"]

[tool.flwr.app]
publisher = "flower-pfl"
fab-include = ["flower_floor_app.py"]

[tool.flwr.app.components]
serverapp = "flower_floor_app:serverapp"
clientapp = "flower_floor_app:clientapp"

[tool.flwr.app.config]
num-rounds = 26
fraction-evaluate = 0.0       # 0: training exchanges only; 1: every node evaluated every round
pull-interval = 0.0           # seconds between the ServerApp's looks for replies (0: Flower's own)
record-dir = ""               # where the ServerApp and the ClientApp write what they saw ("": nowhere)
client-state-dir = ""         # named by FlwrRunEngine's command; this app keeps no state
"""


def floor_app(work: Path) -> Path:
    """The floor's Flower app folder: its ``pyproject.toml`` and ``flower_floor_app.py``."""
    app = work / "floor_app"
    app.mkdir(parents=True, exist_ok=True)
    (app / "pyproject.toml").write_text(FLOOR_PYPROJECT)
    shutil.copy(HERE / "flower_floor_app.py", app / "flower_floor_app.py")
    return app


def steady(ends: Mapping[int, float], first: int, last: int) -> float:
    """Seconds per round of rounds ``first .. last`` from the times rounds ended (round 0: the start)."""
    return (ends[last] - ends[first - 1]) / (last - first + 1)


def spread(ends: Mapping[int, float], first: int, last: int) -> dict[str, float]:
    """The shortest, median and longest of rounds ``first .. last``, in ms."""
    rounds = [ends[r] - ends[r - 1] for r in range(first, last + 1)]
    return {"min": 1e3 * min(rounds), "median": 1e3 * median(rounds), "max": 1e3 * max(rounds)}


def metrics_ends(folder: Path) -> dict[int, float]:
    """Each round's end in a package run's ``metrics.jsonl``: its last row's ``elapsed_s``."""
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line]
    return {r["round"]: r["elapsed_s"] for r in rows}


def on_app(engine: FlwrRunEngine, app: Path) -> FlwrRunEngine:
    """``engine`` (its SuperLink, home and federation) running ``app``."""
    other = copy.copy(engine)
    other.app = app.resolve()
    return other


def flwr_run(engine: FlwrRunEngine, run_config: Mapping[str, Any], folder: Path) -> float:
    """One ``flwr run`` of ``engine``'s app on ``NODES`` nodes, its console in ``folder/flwr.log``; the
    command's seconds."""
    folder.mkdir(parents=True, exist_ok=True)
    engine.start()
    cell = Cell(folder.name, folder.name, 0, dict(run_config), NODES, folder, nodes=NODES)
    t0 = time.time()
    with (folder / "flwr.log").open("w") as log:
        subprocess.run(engine.command(cell), cwd=engine.app, env=engine.env, stdout=log, stderr=subprocess.STDOUT, check=False)
    return time.time() - t0


def floor(engine: FlwrRunEngine, folder: Path, fraction_evaluate: float, pull_interval: float) -> dict[str, Any]:
    """One run of the floor app: steady seconds per round (``speed.WINDOW``), the spread of its rounds and
    the messages the ClientApp received, by kind."""
    record = folder / "record"
    record.mkdir(parents=True)
    config = {"num-rounds": FLOOR_ROUNDS, "fraction-evaluate": fraction_evaluate, "pull-interval": pull_interval,
              "record-dir": str(record)}
    command_s = flwr_run(engine, config, folder)
    try:
        server = json.loads((record / "server.json").read_text())
    except FileNotFoundError:
        raise RuntimeError(f"the floor app's run wrote no server.json; see {folder / 'flwr.log'}") from None
    ends = dict(enumerate(server["ends"]))
    first, last = speed.WINDOW
    seen = Counter(json.loads(line)["kind"] for path in record.glob("*.jsonl") for line in path.read_text().splitlines() if line)
    return {"seconds_per_round": steady(ends, first, last), "round_ms": spread(ends, first, last), "messages": {k: seen.get(k, 0) for k in ("train", "evaluate")}, "nodes": server["nodes"],
            "rounds": FLOOR_ROUNDS, "pull_interval": server["pull_interval"], "command_s": command_s}


def schedule_floor(train: float, train_eval: float, every: int = EVAL_EVERY) -> float:
    """The floor of a round that trains every round and evaluates every ``every``-th."""
    return train + (train_eval - train) / every


def in_process(config: Mapping[str, Any], first: int, last: int, threads: int = 1) -> dict[str, Any]:
    """The package's apps in this process on ``NODES`` nodes (``threads`` torch threads): steady seconds per
    round from the run's ``metrics.jsonl``."""
    import torch

    from server_apps.inprocess import run_in_process

    torch.set_num_threads(threads)
    t0 = time.time()
    folder = run_in_process(config, num_clients=config["num-clients"], num_nodes=NODES)
    ends = metrics_ends(folder)
    return {"seconds_per_round": steady(ends, first, last), "round_ms": spread(ends, first, last), "command_s": time.time() - t0}


def package_flwr(engine: FlwrRunEngine, config: Mapping[str, Any], folder: Path, first: int, last: int) -> dict[str, Any]:
    """The package's apps (or ``engine``'s app running them) under ``flwr run`` on ``NODES`` nodes: steady
    seconds per round from the run's ``metrics.jsonl``."""
    command_s = flwr_run(engine, {**config, "output-dir": str(folder)}, folder)
    runs = sorted(p.parent for p in folder.glob("*/metrics.jsonl"))
    if not runs:
        raise RuntimeError(f"the package's flwr run wrote no metrics.jsonl; see {folder / 'flwr.log'}")
    ends = metrics_ends(runs[-1])
    return {"seconds_per_round": steady(ends, first, last), "round_ms": spread(ends, first, last), "command_s": command_s}


def quick_start_config(out: Path) -> dict[str, Any]:
    """The README's quick start (``speed.SETTING``, FedMCSA) with its 100 clients on ``NODES`` nodes."""
    return speed.run_config(METHOD, out, NODES)


def cnn_config(data: Path, out: Path, rounds: int) -> dict[str, Any]:
    """FedAvg's CNN on the written CIFAR-100 files, 100 clients on ``NODES`` nodes (``client_speed``'s workload)."""
    return {**client_speed.run_config("cnn-cifar100", "cpu", data), "num-rounds": rounds, "num-clients": client_speed.NODES,
            "output-dir": str(out)}


def render(results: Mapping[str, Any]) -> str:
    """The tables of a ``results.json``."""
    fl = results["floor"]
    first, last = speed.WINDOW
    lines = [f"Flower's floor: FedAvg (`Strategy.start`) on an MLR-sized model, a ClientApp that answers at once, "
             f"`flwr run` on {NODES} nodes, steady rounds {first}-{last} of {FLOOR_ROUNDS}", "",
             "| run | pull interval | s/round | round ms: min / median / max | messages: train / evaluate |",
             "|---|---:|---:|---:|---:|"]
    for name, run in fl["runs"].items():
        lines.append(f"| {name} | {run['pull_interval']} s | {run['seconds_per_round']:.3f} | {ms(run)} | "
                     f"{run['messages']['train']} / {run['messages']['evaluate']} |")
    for pull, value in fl["schedule"].items():
        lines.append(f"| floor of the package's schedule (train every round, evaluate every {EVAL_EVERY}th) | {pull} s | {value:.3f} | | |")
    pk = results["package"]
    lines += ["", f"The package: the quick start ({METHOD}, MLR on Synthetic, 100 clients on {NODES} nodes), steady rounds {first}-{last}", "",
              "| | s/round | round ms: min / median / max |", "|---|---:|---:|",
              f"| in process | {pk['in process']['seconds_per_round']:.3f} | {ms(pk['in process'])} |",
              f"| `flwr run` | {pk['flwr run']['seconds_per_round']:.3f} | {ms(pk['flwr run'])} |",
              f"| `flwr run` / in process | {pk['ratio']:.2f}× | |",
              f"| Flower's floor for the same schedule | {pk['floor']:.3f} | |",
              f"| the package on top of the floor | {pk['above_floor']:.3f} ({100 * pk['above_floor_share']:.0f}% of its `flwr run` round) | |"]
    if results.get("cnn"):
        cnn = results["cnn"]
        lines += ["", f"Compute-heavy: FedAvg, 4-layer CNN on CIFAR-100 files ({cnn['images']} random images), Dirichlet(0.5), "
                  f"100 clients on {NODES} nodes, 20 a round, 20 steps of 20, evaluation every 5, steady rounds 3-{cnn['rounds']}", "",
                  "| run | s/round | × in process | round ms: min / median / max |", "|---|---:|---:|---:|",
                  f"| in process (one torch thread) | {cnn['in process']['seconds_per_round']:.3f} | 1.00 | {ms(cnn['in process'])} |",
                  f"| `flwr run` | {cnn['flwr run']['seconds_per_round']:.3f} | {cnn['ratio']:.2f} | {ms(cnn['flwr run'])} |"]
    lines += ["", f"Machine at the start: {results['machine']['start']}", f"Machine at the end: {results['machine']['end']}",
              f"`flwr run` federation: num-supernodes={NODES}, {results['federation']}"]
    return "\n".join(lines)


def ms(run: Mapping[str, Any]) -> str:
    """A run's shortest, median and longest round in ms."""
    spread = run["round_ms"]
    return f"{spread['min']:.0f} / {spread['median']:.0f} / {spread['max']:.0f}"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flower-pull", action="store_true", help="also measure the floor at Flower's own pull interval (0.1 s)")
    parser.add_argument("--skip-cnn", action="store_true", help="leave out the compute-heavy workload")
    parser.add_argument("--images", type=int, default=6000, help="images written to CIFAR-100's files (default %(default)s)")
    parser.add_argument("--cnn-rounds", type=int, default=8, help="rounds of the CNN runs (steady: 3 onwards; default %(default)s)")
    parser.add_argument("--out", type=Path, help="also write table.md and results.json here")
    parser.add_argument("--keep", action="store_true", help="keep the runs' folders (printed at the end)")
    args = parser.parse_args(argv)
    if args.cnn_rounds < 3:
        parser.error("--cnn-rounds must be at least 3 (the steady rounds are 3 onwards)")
    logging.getLogger("flwr").setLevel(logging.WARNING)
    results: dict[str, Any] = {"machine": {"start": client_speed.machine()}, "federation": dict(RESOURCES), "nodes": NODES}
    print(f"# Flower's floor beside the package: {results['machine']['start']}\n", flush=True)
    work = Path(tempfile.mkdtemp(prefix="flower-pfl-floor-"))
    engine = FlwrRunEngine(work / "flwr-home", federation=RESOURCES)
    first, last = speed.WINDOW
    try:
        floor_engine = on_app(engine, floor_app(work))
        pulls = [PULL_INTERVAL, 0.0] if args.flower_pull else [PULL_INTERVAL]
        runs, schedule = {}, {}
        for pull in pulls:
            label = "" if pull else ", Flower's pull interval"
            for name, fraction in (("train only", 0.0), ("train + evaluate", 1.0)):
                run = floor(engine=floor_engine, folder=work / f"floor-{fraction}-{pull}", fraction_evaluate=fraction, pull_interval=pull)
                runs[name + label] = run
                print(f"floor, {name}{label}: {run['seconds_per_round']:.3f} s/round, messages {run['messages']}", flush=True)
            shown = runs[f"train only{label}"]["pull_interval"]
            schedule[str(shown)] = schedule_floor(runs[f"train only{label}"]["seconds_per_round"], runs[f"train + evaluate{label}"]["seconds_per_round"])
        results["floor"] = {"runs": runs, "schedule": schedule}

        inproc = in_process(quick_start_config(work / "package-inprocess"), first, last)
        print(f"package, in process: {inproc['seconds_per_round']:.3f} s/round", flush=True)
        flwr = package_flwr(engine, quick_start_config(work / "package-flwr"), work / "package-flwr", first, last)
        print(f"package, flwr run: {flwr['seconds_per_round']:.3f} s/round", flush=True)
        base = schedule[str(PULL_INTERVAL)]
        above = flwr["seconds_per_round"] - base
        results["package"] = {"in process": inproc, "flwr run": flwr, "ratio": flwr["seconds_per_round"] / inproc["seconds_per_round"],
                              "floor": base, "above_floor": above, "above_floor_share": above / flwr["seconds_per_round"]}

        if not args.skip_cnn:
            data = work / "data"
            client_speed.write_cifar100(data, args.images - args.images // 6, args.images // 6)
            with client_speed.written_cifar():
                cnn_in = in_process(cnn_config(data, work / "cnn-inprocess", args.cnn_rounds), 3, args.cnn_rounds)
            print(f"cnn, in process: {cnn_in['seconds_per_round']:.3f} s/round", flush=True)
            cnn_engine = on_app(engine, speed.module_app(work / "written_data_app", HERE / "written_data_app.py"))
            cnn_flwr = package_flwr(cnn_engine, cnn_config(data, work / "cnn-flwr", args.cnn_rounds), work / "cnn-flwr", 3, args.cnn_rounds)
            print(f"cnn, flwr run: {cnn_flwr['seconds_per_round']:.3f} s/round", flush=True)
            results["cnn"] = {"in process": cnn_in, "flwr run": cnn_flwr, "ratio": cnn_flwr["seconds_per_round"] / cnn_in["seconds_per_round"],
                              "images": args.images, "rounds": args.cnn_rounds}
    finally:
        engine.stop()
    results["machine"]["end"] = client_speed.machine()
    table = render(results)
    publish(table, results, args.out, work, args.keep, "runs' folders")
    return results


if __name__ == "__main__":
    main()
