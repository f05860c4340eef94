"""A round's local training, four ways, side by side: the bare sequential loop and the bare batched
loop (``benchmarks/client_floor.py``: PyTorch alone), and the package's in-process run with its clients
one by one and as one computation (``batch-clients``).

    python -m benchmarks.client_speed                        # MLR, DNN, CNN; CPU, and CUDA when present
    python -m benchmarks.client_speed --models dnn --devices cpu --rounds 12
    python -m benchmarks.client_speed --models cnn --repeats 1             # a CNN round takes seconds on a CPU
    python -m benchmarks.client_speed --models cnn-cifar100 resnet18 --devices cuda

The workload: FedAvg on 100 clients (``--clients``), 20 per round (``--per-round``), 20 local SGD steps
(``--local-steps``) of 20 samples at lr 0.02, every client evaluated every 5 rounds; MLR and the DNN on
Synthetic(0.5, 0.5), the CNN (McMahan et al.'s, ``model = "cnn"``) on 28x28x1 images (random pixels in
Fashion-MNIST's files, 40,000 + 10,000 of them), ``cnn-cifar100`` (the same CNN: PFLlib's "4-layer CNN",
``FedAvgCNN``) and ResNet-18 (``model = "resnet18"``: batch normalization, the CIFAR stem) on 32x32x3
images of 100 classes (random pixels in CIFAR-100's files, its 50,000 + 10,000), written to a temporary
folder (``--images`` writes fewer), Dirichlet(0.5) label skew. It prints the steady seconds per round
(rounds 3 to ``--rounds``; the package's from its ``metrics.jsonl``) and the seconds of an evaluation of every
client (the bare batched one: one forward pass over every client's test split), the median of ``--repeats`` runs
of each way taken in turn, and clients trained per second, with one torch thread on the CPU. ``--out DIR`` writes ``table.md``
and ``results.json`` (every run's figure) there.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import struct
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.client_floor import Federation, batched_evaluate, batched_round, evaluate, sequential_round
from flower_pfl.experiment.build import load_client_data, make_model
from flower_pfl.experiment.config import ExperimentConfig
from server_apps.inprocess import run_in_process

NODES, PER_ROUND, STEPS, BATCH, LR, EVAL_EVERY = 100, 20, 20, 20, 0.02, 5
SETTINGS = {"method": "fedavg", "batch-size": BATCH, "lr": LR, "eval-every": EVAL_EVERY, "seed": 0, "checkpoint-every": 0}
#: each ``--models`` name's run config: the package's model and its data
MODELS: dict[str, dict[str, Any]] = {
    "mlr": {"model": "mlr"}, "dnn": {"model": "dnn"},
    "cnn": {"model": "cnn", "dataset": "fmnist", "partition": "dirichlet"},
    "cnn-cifar100": {"model": "cnn", "dataset": "cifar100", "partition": "dirichlet"},
    "resnet18": {"model": "resnet18", "dataset": "cifar100", "partition": "dirichlet"},
}


def write_images(folder: Path, n_train: int = 40_000, n_test: int = 10_000) -> None:
    """Fashion-MNIST's files with random pixels and labels (what the CNN's time depends on: shapes)."""
    rng = np.random.default_rng(0)
    raw = folder / "FashionMNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(struct.pack(">iiii", 2051, n, 28, 28)
                                                          + rng.integers(0, 256, (n, 28, 28), dtype=np.uint8).tobytes())
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(struct.pack(">ii", 2049, n) + rng.integers(0, 10, n, dtype=np.uint8).tobytes())


def write_cifar100(folder: Path, n_train: int = 50_000, n_test: int = 10_000) -> None:
    """CIFAR-100's files (torchvision's ``cifar-100-python/{train,test,meta}``: pickled dicts of ``data``,
    uint8 rows of 3x32x32 pixels, ``fine_labels`` and ``coarse_labels``) with random pixels and labels."""
    rng = np.random.default_rng(0)
    root = folder / "cifar-100-python"
    root.mkdir(parents=True, exist_ok=True)
    for part, n in (("train", n_train), ("test", n_test)):
        fine = rng.integers(0, 100, n)
        entry = {"filenames": [f"{part}_{i}.png" for i in range(n)], "batch_label": f"{part} batch 1 of 1",
                 "fine_labels": fine.tolist(), "coarse_labels": (fine // 5).tolist(),
                 "data": rng.integers(0, 256, (n, 3 * 32 * 32), dtype=np.uint8)}
        with (root / part).open("wb") as file:
            pickle.dump(entry, file, protocol=4)
    with (root / "meta").open("wb") as file:
        pickle.dump({"fine_label_names": [f"class{i}" for i in range(100)],
                     "coarse_label_names": [f"superclass{i}" for i in range(20)]}, file)


@contextmanager
def written_cifar() -> Iterator[None]:
    """torchvision reads the written CIFAR files while inside: it checks that they exist, not their md5
    sums (which random pixels cannot match)."""
    try:
        from torchvision.datasets import cifar
    except ImportError:  # no torchvision: no image data set either
        yield
        return
    checked = cifar.check_integrity
    cifar.check_integrity = lambda path, md5=None: os.path.isfile(path)
    try:
        yield
    finally:
        cifar.check_integrity = checked


def write_data(models: list[str], folder: Path, images: int | None = None) -> None:
    """The image files ``models`` train on, with random pixels: all of the data set's, or ``images``
    of them (five sixths train, one sixth test)."""
    sizes = () if images is None else (images - images // 6, images // 6)
    if any(MODELS[m].get("dataset") == "fmnist" for m in models):
        write_images(folder, *sizes)
    if any(MODELS[m].get("dataset") == "cifar100" for m in models):
        write_cifar100(folder, *sizes)


def run_config(model: str, device: str, data_dir: Path, per_round: int = PER_ROUND, steps: int = STEPS) -> dict[str, Any]:
    spec = MODELS[model]
    data = {"data-dir": str(data_dir)} if "dataset" in spec else {}
    return {**SETTINGS, "clients-per-round": per_round, "local-steps": steps, **spec, "device": device, **data}


def federation(config: dict[str, Any], device: str, nodes: int = NODES) -> Federation:
    """The package's own clients of ``config``, held in memory for the bare loops."""
    cfg = ExperimentConfig.from_mapping({**ExperimentConfig().to_run_config(), **config})
    clients = [load_client_data(cfg, i, nodes) for i in range(nodes)]
    return Federation([c.x_train.to(device) for c in clients], [c.y_train.to(device) for c in clients],
                      [c.x_test.to(device) for c in clients], [c.y_test.to(device) for c in clients],
                      lambda: make_model(cfg).to(device))


def bare(fed: Federation, rounds: int, batched: bool, per_round: int = PER_ROUND, steps: int = STEPS) -> tuple[float, float]:
    """Steady seconds per round of a bare loop (rounds 3 to ``rounds``), and the median seconds of its
    evaluations of every client (``evaluate``; batched: ``batched_evaluate``)."""
    model, generator = fed.make_model(), torch.Generator().manual_seed(0)
    train, check = (batched_round, batched_evaluate) if batched else (sequential_round, evaluate)
    times, evaluations = [], []
    for r in range(1, rounds + 1):
        start = time.perf_counter()
        clients = torch.randperm(len(fed.y_train), generator=generator)[:per_round].tolist()
        train(fed, model, clients, steps=steps, batch=BATCH, lr=LR, generator=generator)
        if r == 1 or r % EVAL_EVERY == 0 or r == rounds:
            began = _synced()
            check(model, fed)
            evaluations.append(_synced() - began)
        times.append(_synced() - start)
    return float(np.mean(times[2:])), float(np.median(evaluations[1:] or evaluations))


def _synced() -> float:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter()


def package(config: dict[str, Any], rounds: int, batched: bool, out: Path, nodes: int = NODES) -> tuple[float, float]:
    """Steady seconds per round of the package's in-process run, and the median seconds of its evaluations of
    every client after round 2 (a round's evaluation row's time less its training row's), from its ``metrics.jsonl``."""
    folder = run_in_process({**config, "num-rounds": rounds, "batch-clients": batched, "output-dir": str(out)}, num_clients=nodes)
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    ends = {r["round"]: r["elapsed_s"] for r in rows}  # the last row of each round
    trained = {r["round"]: r["elapsed_s"] for r in rows if r.get("phase") == "train"}
    evaluations = [r["elapsed_s"] - trained[r["round"]] for r in rows
                   if r.get("phase") == "evaluate" and r["round"] > 2 and r["round"] in trained]
    return (ends[rounds] - ends[2]) / (rounds - 2), float(np.median(evaluations)) if evaluations else float("nan")


def measure(config: dict[str, Any], device: str, rounds: int, repeats: int, runs: Path, nodes: int = NODES) -> dict[str, Any]:
    """The four ways' median steady seconds per round and seconds of an evaluation of every client
    (``<way>_evaluation``; ``all``: every run's), ``repeats`` runs of each taken in turn, so that a change in the
    machine's load hits all four."""
    fed = federation(config, device, nodes)
    per_round, steps = config["clients-per-round"], config["local-steps"]
    ways = {"bare_sequential": lambda: bare(fed, rounds, False, per_round, steps),
            "bare_batched": lambda: bare(fed, rounds, True, per_round, steps),
            "package_sequential": lambda: package(config, rounds, False, runs, nodes),
            "package_batched": lambda: package(config, rounds, True, runs, nodes)}
    times: dict[str, list[tuple[float, float]]] = {way: [] for way in ways}
    for _ in range(repeats):
        for way, run in ways.items():
            times[way].append(run())
    medians = {way: float(np.median([t[0] for t in runs_])) for way, runs_ in times.items()}
    evaluations = {f"{way}_evaluation": float(np.median([t[1] for t in runs_])) for way, runs_ in times.items()}
    return {**medians, **evaluations, "all": times}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlr", "dnn", "cnn"], choices=list(MODELS))
    parser.add_argument("--devices", nargs="+", default=["cpu", "cuda"], choices=["cpu", "cuda"])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each way, in turn; their median is printed")
    parser.add_argument("--clients", type=int, default=NODES, help="clients in the federation")
    parser.add_argument("--per-round", type=int, default=PER_ROUND, help="clients sampled per round")
    parser.add_argument("--local-steps", type=int, default=STEPS, help="local SGD steps per client and round")
    parser.add_argument("--images", type=int, help="images written to the image data sets' files (default: their real counts)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.rounds < 3:
        parser.error("--rounds must be at least 3 (the steady rounds are 3 onwards)")
    torch.set_num_threads(1)
    devices = [d for d in args.devices if d == "cpu" or torch.cuda.is_available()]
    rows = []
    cifar = any(MODELS[m].get("dataset") == "cifar100" for m in args.models)
    with tempfile.TemporaryDirectory() as tmp, written_cifar() if cifar else nullcontext():
        write_data(args.models, Path(tmp) / "data", args.images)
        for device in devices:
            for model in args.models:
                config = run_config(model, device, Path(tmp) / "data", args.per_round, args.local_steps)
                row = {"model": model, "device": device, "clients": args.clients, "per_round": args.per_round,
                       **measure(config, device, args.rounds, args.repeats, Path(tmp) / "runs", args.clients)}
                rows.append(row)
                print(line(row), flush=True)
    table = "\n".join([HEADER, *(line(r) for r in rows)])
    result = {"machine": machine(), "rounds": args.rounds, "repeats": args.repeats, "clients": args.clients,
              "per_round": args.per_round, "local_steps": args.local_steps, "rows": rows, "table": table}
    print(f"\n{result['machine']}\n{table}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "table.md").write_text(f"{result['machine']}\n\n{table}\n")
        (args.out / "results.json").write_text(json.dumps(result, indent=1))
    return result


HEADER = ("| model | device | bare sequential s/round | bare batched | package one by one (× bare sequential) | "
          "package batched (× bare batched) | package batched: clients/s | speed-up of batching | "
          "evaluation of every client: bare one by one | bare batched | package batched (× bare batched) |\n"
          "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")


def line(r: dict[str, Any]) -> str:
    evaluation = (f" {r['bare_sequential_evaluation']:.4f} | {r['bare_batched_evaluation']:.4f} | "
                  f"{r['package_batched_evaluation']:.4f} ({r['package_batched_evaluation'] / r['bare_batched_evaluation']:.2f}×) |")
    return (f"| {r['model']} | {r['device']} | {r['bare_sequential']:.4f} | {r['bare_batched']:.4f} | "
            f"{r['package_sequential']:.4f} ({r['package_sequential'] / r['bare_sequential']:.2f}×) | "
            f"{r['package_batched']:.4f} ({r['package_batched'] / r['bare_batched']:.2f}×) | "
            f"{rate(r['per_round'] / r['package_batched'])} | {r['package_sequential'] / r['package_batched']:.2f}× |" + evaluation)


def rate(clients_per_second: float) -> str:
    return f"{clients_per_second:.0f}" if clients_per_second >= 10 else f"{clients_per_second:.2f}"


def machine() -> str:
    """The processor (``/proc/cpuinfo``'s model name where there is one), cores, GPU, torch and the load."""
    gpu = f", {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    return f"{processor()}, {os.cpu_count()} cores{gpu}; torch {torch.__version__}; load {load}"


def processor() -> str:
    try:
        for entry in Path("/proc/cpuinfo").read_text().splitlines():
            if entry.startswith("model name"):
                return entry.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


if __name__ == "__main__":
    main()
