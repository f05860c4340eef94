"""The speed targets side by side, in one run on one machine: ``flwr run`` against in process, in process
against the bare PyTorch loops, and Flower's own floor under ``flwr run``.

    python -m benchmarks.speed_targets --out benchmarks/results/speed_targets    # about 8 minutes on 2 cores

It runs, in this order (so one load figure covers them all):

1. ``benchmarks.client_speed``'s workload for MLR and the DNN (FedAvg, 100 clients on one node, 20 a round,
   20 local steps, every client evaluated every 5 rounds): the package in process against the bare batched
   loop, per round and per evaluation of every client, and Flower's ``FedAvg`` alone evaluating 100 clients
   with the model's arrays (``benchmarks.flower_message_floor``), the least an evaluation adds to the bare one;
2. ``benchmarks.flwr_floor``'s floor: Flower's ``FedAvg`` and a ClientApp that answers at once under
   ``flwr run`` on 2 nodes, training only and training + evaluation, and from them the floor of the package's
   schedule;
3. the README's quick start (FedMCSA, 100 clients on 2 nodes) in process and under ``flwr run``, taken in
   turn ``--repeats`` times (a ``flwr run`` round is one or two of Flower's 100 ms scans, so single runs
   vary): the median of each;
4. the compute-heavy workload (the 4-layer CNN on CIFAR-100's files, 20 clients a round, 20 steps) in
   process with one torch thread and with one per core, and under ``flwr run`` (one CPU per node).

It prints every figure and a table of the targets: what each compares, its goal, the figure and whether
it is met; ``--out DIR`` writes ``table.md`` and ``results.json`` there.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from statistics import median
from typing import Any

from flower_pfl.tools.sweep_flwr import RESOURCES, FlwrRunEngine
from server_apps.app import PULL_INTERVAL

from . import client_speed, flower_message_floor, flwr_floor, speed
from .common import save

#: goals: ``flwr run`` against in process, in process against the bare batched loop
FLWR_GOAL, CNN_GOAL, BARE_GOAL, EVALUATION_GOAL = 1.3, 1.1, 1.5, 1.5
#: where Flower's scan makes ``FLWR_GOAL`` unreachable: what the package may add on top of Flower's floor
ABOVE_FLOOR_GOAL = 0.10


def bare_rows(models: Sequence[str], rounds: int, repeats: int, work: Path) -> list[dict[str, Any]]:
    """``client_speed.measure`` of each model on the CPU (its four ways, ``repeats`` runs each in turn), and
    ``flower_evaluation``: the seconds of Flower's ``FedAvg`` alone evaluating as many clients with the model's
    arrays, one message each (``flower_message_floor``), which no in-process evaluation can go below."""
    import torch

    torch.set_num_threads(1)
    rows = []
    for model in models:
        config = client_speed.run_config(model, "cpu", work / "data")
        shapes = {name: tuple(t.shape) for name, t in client_speed.federation(config, "cpu").make_model().state_dict().items()}
        rows.append({"model": model, "device": "cpu", "clients": client_speed.NODES, "per_round": client_speed.PER_ROUND,
                     **client_speed.measure(config, "cpu", rounds, repeats, work / "runs"),
                     "flower_evaluation": flower_message_floor.evaluation_floor(client_speed.NODES, 30, shapes)[0]["total"]})
        print(client_speed.line(rows[-1]), flush=True)
    return rows


def quick_start(engine: FlwrRunEngine, work: Path, repeats: int) -> dict[str, Any]:
    """The quick start in process and under ``flwr run``, ``repeats`` times each in turn: every run and the medians."""
    first, last = speed.WINDOW
    runs: dict[str, list[dict[str, Any]]] = {"in process": [], "flwr run": []}
    for i in range(repeats):
        runs["in process"].append(flwr_floor.in_process(flwr_floor.quick_start_config(work / f"qs-in-{i}"), first, last))
        folder = work / f"qs-flwr-{i}"
        runs["flwr run"].append(flwr_floor.package_flwr(engine, flwr_floor.quick_start_config(folder), folder, first, last))
        print(f"quick start {i + 1}/{repeats}: in process {runs['in process'][-1]['seconds_per_round']:.3f}, "
              f"flwr run {runs['flwr run'][-1]['seconds_per_round']:.3f} s/round", flush=True)
    return {"runs": runs, **{name: median(r["seconds_per_round"] for r in rs) for name, rs in runs.items()}}


def cnn(engine: FlwrRunEngine, work: Path, images: int, rounds: int) -> dict[str, Any]:
    """The CNN workload in process (one torch thread, then one per core) and under ``flwr run``."""
    data = work / "data-cnn"
    client_speed.write_cifar100(data, images - images // 6, images // 6)
    out: dict[str, Any] = {"images": images, "rounds": rounds}
    threads = os.cpu_count() or 1
    with client_speed.written_cifar():
        for n in dict.fromkeys((1, threads)):
            out[f"in process, {n} torch thread{'s' if n > 1 else ''}"] = flwr_floor.in_process(
                flwr_floor.cnn_config(data, work / f"cnn-in-{n}", rounds), 3, rounds, threads=n)
    app = flwr_floor.on_app(engine, speed.module_app(work / "written_data_app", flwr_floor.HERE / "written_data_app.py"))
    out["flwr run"] = flwr_floor.package_flwr(app, flwr_floor.cnn_config(data, work / "cnn-flwr", rounds), work / "cnn-flwr", 3, rounds)
    for name in [k for k in out if k.startswith(("in process", "flwr"))]:
        print(f"cnn, {name}: {out[name]['seconds_per_round']:.3f} s/round", flush=True)
    return out


def targets(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each target: what it compares, its goal, the figure and whether it is met."""
    out = []
    qs = results["quick_start"]
    floor = results["floor"]["schedule"][str(PULL_INTERVAL)]
    ratio = qs["flwr run"] / qs["in process"]
    out.append({"target": "quick start: `flwr run` / in process (2 nodes)", "goal": f"≤ {FLWR_GOAL}×",
                "figure": f"{ratio:.2f}× (Flower's floor alone: {floor / qs['in process']:.2f}×)", "met": ratio <= FLWR_GOAL})
    above = (qs["flwr run"] - floor) / qs["flwr run"]
    out.append({"target": "quick start: the package on top of Flower's floor, share of its `flwr run` round",
                "goal": f"< {ABOVE_FLOOR_GOAL:.0%}", "figure": f"{above:.0%} ({qs['flwr run']:.3f} against {floor:.3f} s)",
                "met": above < ABOVE_FLOOR_GOAL})
    if "cnn" in results:
        c = results["cnn"]
        for name in [k for k in c if k.startswith("in process")]:
            r = c["flwr run"]["seconds_per_round"] / c[name]["seconds_per_round"]
            out.append({"target": f"CNN: `flwr run` / {name}", "goal": f"≤ {CNN_GOAL}×", "figure": f"{r:.2f}×", "met": r <= CNN_GOAL})
    for row in results["bare"]:
        r = row["package_batched"] / row["bare_batched"]
        out.append({"target": f"{row['model'].upper()}: in process / bare batched loop, per round", "goal": f"≤ {BARE_GOAL}×",
                    "figure": f"{r:.2f}× ({row['package_batched']:.4f} against {row['bare_batched']:.4f} s)", "met": r <= BARE_GOAL})
        bare = row["bare_batched_evaluation"]
        e = row["package_batched_evaluation"] / bare
        alone = f"; Flower's FedAvg alone on top: {(bare + row['flower_evaluation']) / bare:.2f}×" if "flower_evaluation" in row else ""
        out.append({"target": f"{row['model'].upper()}: evaluation of 100 clients / bare batched evaluation", "goal": f"≤ {EVALUATION_GOAL}×",
                    "figure": f"{e:.2f}× ({row['package_batched_evaluation']:.4f} against {bare:.4f} s{alone})",
                    "met": e <= EVALUATION_GOAL})
    return out


def render(results: Mapping[str, Any]) -> str:
    lines = ["| target | goal | measured | met |", "|---|---:|---|---|"]
    lines += [f"| {t['target']} | {t['goal']} | {t['figure']} | {'yes' if t['met'] else 'no'} |" for t in results["targets"]]
    lines += ["", client_speed.HEADER, *(client_speed.line(r) for r in results["bare"]), ""]
    fl = results["floor"]
    lines += ["| Flower's floor (`flwr run`, 2 nodes) | s/round | round ms: min / median / max |", "|---|---:|---:|"]
    lines += [f"| {name} | {run['seconds_per_round']:.3f} | {flwr_floor.ms(run)} |" for name, run in fl["runs"].items()]
    lines += [f"| the package's schedule (evaluation every {flwr_floor.EVAL_EVERY}th round) | {fl['schedule'][str(PULL_INTERVAL)]:.3f} | |", ""]
    qs = results["quick_start"]
    lines += ["| quick start (FedMCSA, 100 clients on 2 nodes) | s/round, each run | median |", "|---|---|---:|"]
    for name in ("in process", "flwr run"):
        each = ", ".join(f"{r['seconds_per_round']:.3f}" for r in qs["runs"][name])
        lines.append(f"| {name} | {each} | {qs[name]:.3f} |")
    if "cnn" in results:
        c = results["cnn"]
        lines += ["", f"| CNN on CIFAR-100 files ({c['images']} images, 20 clients a round, 20 steps, 2 nodes) | s/round | "
                  "round ms: min / median / max |", "|---|---:|---:|"]
        lines += [f"| {name} | {c[name]['seconds_per_round']:.3f} | {flwr_floor.ms(c[name])} |"
                  for name in c if name.startswith(("in process", "flwr"))]
    lines += ["", f"Machine at the start: {results['machine']['start']}", f"Machine at the end: {results['machine']['end']}",
              f"`flwr run` federation: num-supernodes={flwr_floor.NODES}, {results['federation']}"]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["mlr", "dnn"], choices=["mlr", "dnn"])
    parser.add_argument("--rounds", type=int, default=12, help="rounds of the bare-loop comparison (steady: 3 onwards)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each way, in turn; medians are reported")
    parser.add_argument("--skip-cnn", action="store_true", help="leave out the compute-heavy workload")
    parser.add_argument("--images", type=int, default=6000, help="images written to CIFAR-100's files")
    parser.add_argument("--cnn-rounds", type=int, default=6, help="rounds of the CNN runs (steady: 3 onwards)")
    parser.add_argument("--out", type=Path, help="also write table.md and results.json here")
    args = parser.parse_args(argv)
    if args.rounds < 3 or args.cnn_rounds < 3:
        parser.error("--rounds and --cnn-rounds must be at least 3 (the steady rounds are 3 onwards)")
    logging.getLogger("flwr").setLevel(logging.WARNING)
    results: dict[str, Any] = {"machine": {"start": client_speed.machine()}, "federation": dict(RESOURCES)}
    print(f"# flower-pfl speed targets: {results['machine']['start']}\n", flush=True)
    work = Path(tempfile.mkdtemp(prefix="flower-pfl-targets-"))
    engine = FlwrRunEngine(work / "flwr-home", federation=RESOURCES)
    try:
        results["bare"] = bare_rows(args.models, args.rounds, args.repeats, work)
        floor_engine = flwr_floor.on_app(engine, flwr_floor.floor_app(work))
        runs = {name: flwr_floor.floor(floor_engine, work / f"floor-{fraction}", fraction, PULL_INTERVAL)
                for name, fraction in (("train only", 0.0), ("train + evaluate", 1.0))}
        results["floor"] = {"runs": runs, "schedule": {str(PULL_INTERVAL): flwr_floor.schedule_floor(
            runs["train only"]["seconds_per_round"], runs["train + evaluate"]["seconds_per_round"])}}
        print("Flower's floor: " + ", ".join(f"{k} {v['seconds_per_round']:.3f}" for k, v in runs.items()) + " s/round", flush=True)
        results["quick_start"] = quick_start(engine, work, args.repeats)
        if not args.skip_cnn:
            results["cnn"] = cnn(engine, work, args.images, args.cnn_rounds)
    finally:
        engine.stop()
        shutil.rmtree(work, ignore_errors=True)
    results["machine"]["end"] = client_speed.machine()
    results["targets"] = targets(results)
    table = render(results)
    print("\n" + table)
    if args.out:
        save(args.out, table, results)
    return results


if __name__ == "__main__":
    main()
