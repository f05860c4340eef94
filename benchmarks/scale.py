"""Federations of 500 and 5,000 clients: the package's in-process run, its time per round and its peak memory.

    python -m benchmarks.scale                                      # 500 and 5,000 clients, memory and disk stores
    python -m benchmarks.scale --clients 500 --store memory --out benchmarks/results/scale
    python -m benchmarks.scale --clients 5000 --method fedavg --rounds 10

The workload: ``--method`` (default FedMCSA, whose server keeps every client's model in its store:
``--store memory`` or ``disk``) with the 4-layer CNN (McMahan et al.'s, ``model = "cnn"``: PFLlib's
``FedAvgCNN``, 0.92 M parameters for 100 classes) on 32x32x3 images of 100 classes: random pixels and
labels in CIFAR-100's files (``cifar-100-python/``, its 50,000 + 10,000 images; ``--images`` writes
fewer), written to a temporary folder, pooled and split iid over ``--clients`` clients (each client's
share is the same size: 120 images each for 500 clients, 12 for 5,000), each share three quarters train,
one quarter test. ``--rounds`` rounds (default 5) of ``--per-round`` sampled clients (default 20),
``--local-steps`` SGD steps (default 20) of 20 samples at lr 0.02, every client evaluated in the first
and the last round, on ``--device`` (default ``auto``: the GPU when there is one). The run's results
folder is in the temporary folder (``TMPDIR``), deleted after each setting: a client's model is 3.7 MB,
so 5,000 clients' take 18.5 GB there (the disk store's files; with the memory store, the checkpoint and
the personalized models written at the end, twice that).

Each setting (clients x store) runs in a fresh process, so that its peak host memory (``ru_maxrss``) is
its own (``results.json``'s ``host_start``: the process before the run, its imports done); on CUDA the
peak device memory is ``torch.cuda.max_memory_allocated`` (PyTorch's tensors; the caching allocator's
reserve, ``max_memory_reserved``, is in ``results.json``, and neither counts the CUDA context, which
``nvidia-smi`` does). Each peak is given twice: during the rounds (up to the end of
the last round's evaluation) and for the whole run, which ends by writing the server's state (the
checkpoint: with the memory store, a copy of every client's model) and the personalized models. It prints
per setting the steady seconds per round (the training of rounds 2 to ``--rounds``, evaluation left
out), the seconds of an evaluation of every client, the peaks and the whole run's seconds (the data's
loading and the final writes included), with the machine, beside PFLlib's figure for the same model and
data (its README: 500 clients in 5.08 GB of GPU memory on one RTX 3090). ``--out DIR`` writes
``table.md`` and ``results.json`` there.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

GB = 1e9
#: PFLlib's figure for the same model and data (its README, "large-scale" scenarios)
PFLLIB = {"clients": 500, "model": "4-layer CNN", "data": "CIFAR-100", "gpu_memory_gb": 5.08, "gpu": "one RTX 3090"}
#: CIFAR-100's images (50,000 train + 10,000 test)
IMAGES = 60_000
SETTINGS = {"model": "cnn", "dataset": "cifar100", "partition": "iid", "batch-size": 20, "lr": 0.02, "seed": 0,
            "checkpoint-every": 0, "figures": False}


def run_setting(config: dict[str, Any], clients: int) -> dict[str, Any]:
    """One in-process run of ``clients`` clients (in a process of its own): its times and peaks."""
    import torch

    from benchmarks.client_speed import written_cifar
    from flower_pfl.experiment.build import resolve_device
    from server_apps import checkpoints
    from server_apps.inprocess import run_in_process

    cuda = resolve_device(config["device"]).type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    rounds: dict[str, float | None] = {}
    save = checkpoints.Checkpointer.save

    def peaks_then_save(self: Any, server_round: int, arrays: Any) -> None:
        if not rounds:  # the last round's end: the checkpoint after it is the run's first (checkpoint-every 0)
            rounds.update(host=_host_peak(), device=torch.cuda.max_memory_allocated() if cuda else None)
        save(self, server_round, arrays)

    checkpoints.Checkpointer.save = peaks_then_save  # type: ignore[method-assign]
    host_start, start = _host_peak(), time.perf_counter()
    try:
        with written_cifar():
            folder = run_in_process(config, num_clients=clients)
    finally:
        checkpoints.Checkpointer.save = save  # type: ignore[method-assign]
    run_s = time.perf_counter() - start
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((folder / "summary.json").read_text())
    trained, evaluated, end = {}, [], 0.0
    for r in rows:
        if r["phase"] == "train":
            trained[r["round"]] = r["elapsed_s"] - end
        elif r["phase"] == "evaluate":
            evaluated.append(r["elapsed_s"] - end)
        end = r["elapsed_s"]
    steady = [t for k, t in trained.items() if k >= 2]
    return {"clients": clients, "store": config["store"], "device": "cuda" if cuda else "cpu",
            "round_s": sum(steady) / len(steady), "rounds_s": [trained[k] for k in sorted(trained)],
            "evaluation_s": sum(evaluated) / len(evaluated) if evaluated else None, "run_s": run_s,
            "host_start": host_start, "host_peak_rounds": rounds.get("host"), "host_peak": _host_peak(),
            "device_peak_rounds": rounds.get("device"), "device_peak": torch.cuda.max_memory_allocated() if cuda else None,
            "device_reserved_peak": torch.cuda.max_memory_reserved() if cuda else None,
            "trained_together": summary.get("clients_trained_together"),
            "trained_one_by_one": summary.get("clients_trained_one_by_one")}


def _host_peak() -> float:
    """The process's peak resident memory in bytes (``ru_maxrss`` is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0


def in_fresh_process(config: dict[str, Any], clients: int) -> dict[str, Any]:
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
        return pool.submit(run_setting, config, clients).result()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[500, 5000])
    parser.add_argument("--store", nargs="+", default=["memory", "disk"], choices=["memory", "disk"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--per-round", type=int, default=20, help="clients sampled per round")
    parser.add_argument("--local-steps", type=int, default=20, help="local SGD steps per client and round")
    parser.add_argument("--method", default="fedmcsa")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--images", type=int, default=IMAGES, help="images written to CIFAR-100's files (default: its 60,000)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (the steady rounds are 2 onwards)")
    from benchmarks.client_speed import machine, write_cifar100

    rows = []
    with tempfile.TemporaryDirectory(prefix="scale-") as tmp:
        data = Path(tmp) / "data"
        write_cifar100(data, args.images - args.images // 6, args.images // 6)
        for clients in args.clients:
            for store in args.store:
                folder = Path(tmp) / f"{clients}-{store}"
                config = {**SETTINGS, "method": args.method, "store": store, "device": args.device, "data-dir": str(data),
                          "num-rounds": args.rounds, "clients-per-round": min(args.per_round, clients),
                          "local-steps": args.local_steps, "eval-every": args.rounds, "output-dir": str(folder / "runs"),
                          "client-state-dir": str(folder / "client-state")}
                rows.append(in_fresh_process(config, clients))
                shutil.rmtree(folder, ignore_errors=True)
                print(line(rows[-1]), flush=True)
    reference = (f"PFLlib (its README): {PFLLIB['clients']} clients of the {PFLLIB['model']} on {PFLLIB['data']} in "
                 f"{PFLLIB['gpu_memory_gb']:.2f} GB of GPU memory, {PFLLIB['gpu']}")
    table = "\n".join([HEADER, *(line(r) for r in rows)])
    workload = (f"{args.method}, the 4-layer CNN on {args.images:,} CIFAR-100-shaped images split iid, {args.rounds} rounds of "
                f"{args.per_round} clients, {args.local_steps} local steps of 20")
    result = {"machine": machine(), "workload": workload, "rounds": args.rounds, "per_round": args.per_round,
              "local_steps": args.local_steps, "method": args.method, "images": args.images, "rows": rows,
              "reference": {**PFLLIB, "text": reference}, "table": table}
    print(f"\n{result['machine']}\n{workload}\n{table}\n{reference}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "table.md").write_text(f"{result['machine']}\n\n{workload}\n\n{table}\n\n{reference}\n")
        (args.out / "results.json").write_text(json.dumps(result, indent=1))
    return result


HEADER = ("| clients | store | device | s/round | evaluation of every client, s | peak device memory, rounds / run | "
          "peak host memory, rounds / run | run, s |\n|---:|---|---|---:|---:|---:|---:|---:|")


def line(r: dict[str, Any]) -> str:
    evaluation = "n/a" if r["evaluation_s"] is None else f"{r['evaluation_s']:.2f}"
    return (f"| {r['clients']:,} | {r['store']} | {r['device']} | {r['round_s']:.3f} | {evaluation} | "
            f"{gigabytes(r['device_peak_rounds'])} / {gigabytes(r['device_peak'])} | "
            f"{gigabytes(r['host_peak_rounds'])} / {gigabytes(r['host_peak'])} | {r['run_s']:.0f} |")


def gigabytes(n: float | None) -> str:
    return "n/a" if n is None else f"{n / GB:.2f} GB"


if __name__ == "__main__":
    main()
