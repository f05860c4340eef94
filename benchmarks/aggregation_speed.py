"""Server aggregation time of every method against the two-GEMM limit, and FedAMP's float32 precision.

For every method class of the registry (IGFL once per attention query) and Flower's FedAvg mean,
the time of one round of server work on the participants' models, an ``(m, d)`` float32 matrix
laid out as a two-layer MLP (weights and biases, so that FedMCSA's per-layer attention, FedAttn's
biases and FedPer's head are exercised): ``MethodServer.aggregate`` of the round's replies, then
``MethodServer.plan_training`` of the next round for the same participants, where personalized
methods compute what they send (FedMCSA's attention, FedAMP's weights ξ, FedAttn's biases). The
replies carry what each method's client algorithm returns (SCAFFOLD's Δc_i, FedAttn's Z_i and bias
gradient) and pass the method's own ``check_extras``; a warm-up round first fills the method's
state (IGFL's previous deltas, FedAttn's representations and attention module), so the one-off
first-round cost is left out of the time (``results.json`` keeps it apart).

Each time is divided by the *two-GEMM limit* on the same matrix in the same process, the least an
attention over whole models costs: ``xn = U / ||U||_row; V = softmax(xn xnᵀ) U``. A personalized
method's round also moves the participants' models into and out of its per-client store (``put``
of the replies, ``get`` of the next participants), which the limit does not. Every time is a
median over repeats after a warm-up call (the limit's over its timings before and after the
methods), with torch's threads as set by ``--threads`` (default: torch's own).

``--device cuda`` puts the server (its per-client store and aggregation) on a GPU. The replies still
arrive on the host and the instructions leave from it, so there the limit includes moving the
round's ``(m, d)`` models onto the device (through pinned memory) and the results back.

FedAMP's precision: its weights ξ (``flower_pfl.methods.attention.fedamp_weights``) from float32 models
against the same function on float64 models and against a float64 ``torch.cdist`` reference, with
the aggregated models ``u_i = Σ_j ξ_ij w_j``, on the benchmark's models and on the models of short
in-process FedAMP runs.

    python -m benchmarks.aggregation_speed                       # small sizes
    python -m benchmarks.aggregation_speed --sizes paper --out benchmarks/results/aggregation_speed
    python -m benchmarks.aggregation_speed --sizes paper --device cuda
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from flower_pfl.engine.layout import ParamLayout
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.engine.model_facts import ModelFacts
from flower_pfl.engine.reply_checks import Reply
from flower_pfl.engine.store import to_device, to_host
from flower_pfl.methods.attention import fedamp_weights
from flower_pfl.methods.igfl import ATTENTION_MODES
from flower_pfl.methods.registry import method_classes

#: ``(m, d)``: participants x parameters
SIZES: dict[str, list[tuple[int, int]]] = {
    "tiny": [(4, 1_000)],
    "small": [(20, 10_000), (100, 10_000)],
    "paper": [(20, 100_000), (100, 100_000), (500, 100_000), (100, 1_000_000)],
}
LIMIT = "two-GEMM limit"
CPU = torch.device("cpu")
FLOWER_FEDAVG = "FedAvg (Flower's mean)"
#: the classes of the MLP layout
CLASSES = 10


# ---------------------------------------------------------------- the models


def mlp_layout(d: int, classes: int = CLASSES, batch_norm: bool = False) -> ParamLayout:
    """A two-layer MLP (``fc1``: ``n_in -> h``, ``fc2``: ``h -> classes``, weights and biases; with ``batch_norm``
    a BatchNorm1d ``bn1`` between them, its affine weights and running statistics) with exactly ``d`` parameters:
    ``h`` is the divisor of ``d - classes`` (less the counter) nearest to ``sqrt(d / 10)``."""
    norm = 4 if batch_norm else 0  # bn1's weight, bias, running mean and variance: h each
    rest = d - classes - (1 if batch_norm else 0)  # = h (n_in + 1 + norm + classes)
    divisors = {k for i in range(1, math.isqrt(max(rest, 0)) + 1) if rest % i == 0 for k in (i, rest // i)}
    fits = [h for h in divisors if rest // h - 1 - norm - classes >= 1]
    if not fits:
        raise ValueError(f"d = {d} is too small for an MLP with {classes} classes (at least {2 * classes + 2})")
    h = min(fits, key=lambda h: (abs(h - math.sqrt(d / 10)), h))
    n_in = rest // h - 1 - norm - classes
    bn = (("bn1.weight", "bn1.bias", "bn1.running_mean", "bn1.running_var", "bn1.num_batches_tracked"),
          ((h,), (h,), (h,), (h,), ())) if batch_norm else ((), ())
    return ParamLayout(("fc1.weight", "fc1.bias", *bn[0], "fc2.weight", "fc2.bias"),
                       ((h, n_in), (h,), *bn[1], (classes, h), (classes,)))


def participant_models(m: int, d: int, seed: int = 0, spread: float = 0.05) -> torch.Tensor:
    """``(m, d)`` float32 models that share a common part and differ by ``spread`` (as models trained
    from one start do)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, d, generator=g) + spread * torch.randn(m, d, generator=g)


def named_arrays(layout: ParamLayout, vector: torch.Tensor) -> dict[str, np.ndarray]:
    return dict(zip(layout.names, layout.to_numpy_list(vector)))


# ---------------------------------------------------------------- timing


def times_ms(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> list[float]:
    """Wall times of ``repeats`` calls of ``fn()`` in ms, after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - t0))
    return times


def two_gemm(u: torch.Tensor) -> torch.Tensor:
    """The two-GEMM limit's computation: row-normalize, similarities, softmax-weighted mean."""
    xn = u / u.norm(dim=1, keepdim=True)
    return torch.softmax(xn @ xn.T, dim=1) @ u


def limit_round(u: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The two-GEMM limit on ``device`` for the host's models ``u``: on a GPU it includes moving the
    round's models in (through pinned memory) and the results out, as a server must."""
    if device.type == "cpu":
        return two_gemm(u)
    out = to_host(two_gemm(to_device(u, device)))
    synchronize(device)
    return out


def synchronize(device: torch.device) -> None:
    """Wait for ``device``'s queued work (a timing on a GPU must include it)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------- the methods


def configurations(m: int) -> list[tuple[str, type, dict[str, Any]]]:
    """``(row label, method class, constructor arguments)``: every method class of the registry with
    its defaults, IGFL once per attention query (and with the plain mean, IGFL-C). FedAMP's ``α_k``
    is ``σ / m`` so that no self weight turns negative with ``m`` participants."""
    out: list[tuple[str, type, dict[str, Any]]] = []
    for cls in method_classes():
        if cls.name == "igfl":
            out += [(f"IGFL ({mode} attention)", cls, {"attention": mode}) for mode in ATTENTION_MODES]
            out.append(("IGFL-C (mean of deltas)", cls, {"attention": None}))
        elif cls.name == "fedamp":
            out.append((cls.strategy, cls, {"alpha_k": 1.0 / m, "sigma": 1.0}))
        else:
            out.append((cls.strategy, cls, {}))
    return out


def fabricated_replies(server: MethodServer, ids: Sequence[int], u: torch.Tensor, seed: int = 0) -> list[Reply]:
    """One accepted reply per participant: row ``i`` of ``u`` as its model, a sample count, and what
    the method's client algorithm returns (random, checked by the method's ``check_extras``)."""
    method = server.method
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(10, 100, (len(ids),), generator=g).tolist()
    replies = []
    for i, cid in enumerate(ids):
        replies.append(Reply(cid, u[i].clone(), counts[i], {"train-loss": 0.5}, method.check_extras(method.example_extras(g))))
    return replies


def time_method(cls: type, kwargs: Mapping[str, Any], layout: ParamLayout, u: torch.Tensor, repeats: int,
                device: torch.device = CPU) -> dict[str, float]:
    """One round of ``cls``'s server work on ``u`` (``aggregate``, then the next ``plan_training``) with
    the server on ``device`` (the replies arrive on the host, the instructions leave from it):
    medians in ms of the whole and of both parts, and the one-off costs (``initialize`` with the
    first plan, and the warm-up round that fills the method's state)."""
    m = u.shape[0]
    ids = list(range(m))
    if cls.check_model(ModelFacts.of_layout(layout)) is not None:  # FedBN: the same size with a batch-norm layer
        layout = mlp_layout(layout.dim, batch_norm=True)
    server = MethodServer(cls(**kwargs), clients_per_round=m, seed=0, device=device)
    t0 = time.perf_counter()
    server.initialize(named_arrays(layout, u[0]))
    server.plan_training(1, ids)
    setup = time.perf_counter() - t0
    replies = fabricated_replies(server, ids, u)
    rounds: list[tuple[float, float]] = []
    for r in range(1, repeats + 2):
        t0 = time.perf_counter()
        server.aggregate(r, replies)
        synchronize(device)
        t1 = time.perf_counter()
        server.plan_training(r + 1, ids)
        synchronize(device)
        rounds.append((t1 - t0, time.perf_counter() - t1))
    first, timed = rounds[0], rounds[1:]
    return {"ms": 1e3 * statistics.median(a + p for a, p in timed),
            "aggregate_ms": 1e3 * statistics.median(a for a, _ in timed),
            "plan_ms": 1e3 * statistics.median(p for _, p in timed),
            "setup_ms": 1e3 * setup, "first_round_ms": 1e3 * sum(first)}


def time_flower_fedavg(layout: ParamLayout, u: torch.Tensor, repeats: int) -> dict[str, float]:
    """Flower's FedAvg mean as its Message-API strategy computes it (``aggregate_arrayrecords`` on
    the replies' records, arrays read from their bytes)."""
    from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict

    from client_apps.flower_internals import aggregate_arrayrecords

    counts = torch.randint(10, 100, (u.shape[0],), generator=torch.Generator().manual_seed(0)).tolist()
    records = [RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in named_arrays(layout, row).items()}),
                           "metrics": MetricRecord({"num-examples": n})}) for row, n in zip(u, counts)]
    return {"ms": statistics.median(times_ms(lambda: aggregate_arrayrecords(records, "num-examples"), repeats))}


def aggregation_table(sizes: Iterable[tuple[int, int]] = SIZES["paper"], repeats: int = 5, seed: int = 0,
                      progress: Callable[[str], None] | None = None, device: torch.device = CPU) -> list[dict[str, Any]]:
    """The table at ``sizes`` (default: the paper sizes), one dict per (row, size): ``method`` (row label), ``name`` (run-config method, ``None`` for the
    reference rows), ``m``, ``d``, ``ms``, ``ratio`` (to the two-GEMM limit at that size) and, for
    methods, ``aggregate_ms``, ``plan_ms``, ``setup_ms``, ``first_round_ms``. The limit is timed
    before and after the methods (its median over both), so that a drift in the machine's load
    shows less in the ratios."""
    out: list[dict[str, Any]] = []
    for m, d in sizes:
        layout, u = mlp_layout(d), participant_models(m, d, seed)
        limit_times = times_ms(lambda u=u: limit_round(u, device), repeats)
        rows: list[dict[str, Any]] = [{"method": FLOWER_FEDAVG, "name": None, **time_flower_fedavg(layout, u, repeats)}]
        for label, cls, kwargs in configurations(m):
            rows.append({"method": label, "name": cls.name, **time_method(cls, kwargs, layout, u, repeats, device)})
            if progress:
                progress(f"m={m} d={d} {label}: {rows[-1]['ms']:.1f} ms")
        limit_times += times_ms(lambda u=u: limit_round(u, device), repeats)
        limit = statistics.median(limit_times)
        rows.append({"method": LIMIT, "name": None, "ms": limit})
        out += [{**row, "m": m, "d": d, "ratio": row["ms"] / limit} for row in rows]
        gc.collect()
    return out


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """A markdown table: one row per method, one column per ``(m, d)``, cells ``time ms (ratio×)``;
    the two-GEMM limit's row last, in ms."""
    sizes = list(dict.fromkeys((r["m"], r["d"]) for r in rows))
    cells = {(r["method"], r["m"], r["d"]): r for r in rows}
    methods = [name for name in dict.fromkeys(r["method"] for r in rows) if name != LIMIT]
    lines = ["| method | " + " | ".join(f"m={m}, d={d:,}" for m, d in sizes) + " |", "|---" * (len(sizes) + 1) + "|"]
    for name in methods:
        row = [cells.get((name, m, d)) for m, d in sizes]
        lines.append(f"| {name} | " + " | ".join(f"{c['ms']:.2f} ms ({c['ratio']:.2f}×)" if c else "" for c in row) + " |")
    limit = [cells.get((LIMIT, m, d)) for m, d in sizes]
    lines.append(f"| **{LIMIT}** | " + " | ".join(f"{c['ms']:.2f} ms" if c else "" for c in limit) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------- FedAMP's precision


def fedamp_reference(u: torch.Tensor, alpha_k: float, sigma: float) -> torch.Tensor:
    """FedAMP's weights in float64 from ``torch.cdist`` distances (the definition, written out)."""
    w = u.double()
    xi = alpha_k * torch.exp(-torch.cdist(w, w) ** 2 / sigma) / sigma
    xi.fill_diagonal_(0.0)
    return xi + torch.diag(1.0 - xi.sum(1))


def fedamp_precision(models: torch.Tensor, alpha_k: float, sigma: float) -> dict[str, float]:
    """Largest absolute differences of FedAMP's weights ξ and aggregated models ``u = ξ W`` computed
    as the method does (float32 models) from the same computation on the models in float64
    (``*_float64``) and from the ``cdist`` reference (``*_cdist``); ``u_max``: the largest ``|u|``."""
    w32, w64 = models.float(), models.double()
    xi32 = fedamp_weights(w32, alpha_k, sigma)  # as FedAMP.personalize computes them, and its models
    u32 = xi32 @ w32
    xi64, ref = fedamp_weights(w64, alpha_k, sigma), fedamp_reference(w64, alpha_k, sigma)
    u64, u_ref = xi64 @ w64, ref @ w64

    def gap(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a.double() - b).abs().max())

    return {"xi_float64": gap(xi32, xi64), "xi_cdist": gap(xi32, ref), "u_float64": gap(u32, u64),
            "u_cdist": gap(u32, u_ref), "xi_offdiag_max": float((ref - torch.diag(ref.diagonal())).abs().max()),
            "u_max": float(u_ref.abs().max())}


def random_precision(m: int, d: int, seed: int = 0) -> dict[str, Any]:
    """``fedamp_precision`` on the benchmark's models, with ``σ`` their mean squared distance (weights
    far from 0) and ``α_k = σ / (2 (m − 1))``."""
    u = participant_models(m, d, seed)
    d2 = torch.cdist(u.double(), u.double()) ** 2
    sigma = float(d2.sum() / (m * (m - 1)))
    return {"data": f"random m={m}, d={d:,}", "alpha_k": sigma / (2 * (m - 1)), "sigma": sigma,
            **fedamp_precision(u, sigma / (2 * (m - 1)), sigma)}


def results_precision(folder: str | Path, label: str) -> dict[str, Any]:
    """``fedamp_precision`` on the server's per-client models of a FedAMP results folder, in groups
    of ``clients-per-round`` clients (a round's participants, so no self weight turns negative), with
    the run's ``α_k`` and ``σ``: the largest difference over the groups."""
    from flower_pfl.run.results import MODELS, load_models

    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    alpha_k, sigma, k = config["fedamp-alpha-k"], config["fedamp-sigma"], config["clients-per-round"]
    _, rows, _ = load_models(folder / MODELS)
    groups = [fedamp_precision(rows[i:i + k], alpha_k, sigma) for i in range(0, len(rows), k)]
    return {"data": label, "alpha_k": alpha_k, "sigma": sigma, **{key: max(g[key] for g in groups) for key in groups[0]}}


def run_precision(rounds: Sequence[int] = (3, 10), num_nodes: int = 100) -> list[dict[str, Any]]:
    """``results_precision`` of in-process FedAMP runs (the package's defaults) of ``rounds`` rounds."""
    from server_apps.inprocess import run_in_process

    logging.getLogger("flwr").setLevel(logging.WARNING)
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in rounds:
            folder = run_in_process({"method": "fedamp", "num-rounds": n, "eval-every": min(5, n), "output-dir": tmp},
                                    num_clients=num_nodes)
            out.append(results_precision(folder, f"fedamp run, after round {n}"))
    return out


def format_precision(rows: Sequence[Mapping[str, Any]]) -> str:
    lines = ["| models | α_k | σ | max ξ_ij (j≠i) | max abs Δξ vs float64 | vs cdist | max abs Δu vs float64 | vs cdist | max abs u |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['data']} | {r['alpha_k']:.3g} | {r['sigma']:.3g} | {r['xi_offdiag_max']:.3g} | {r['xi_float64']:.2e} | "
                     f"{r['xi_cdist']:.2e} | {r['u_float64']:.2e} | {r['u_cdist']:.2e} | {r['u_max']:.3g} |")
    return "\n".join(lines)


# ---------------------------------------------------------------- command line


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", choices=sorted(SIZES), default="small", help="small (default, quick), paper, or tiny")
    ap.add_argument("--repeats", type=int, default=5, help="timed calls per measurement (their median is reported)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    ap.add_argument("--device", default="cpu", help="the server's device: cpu (default), cuda or cuda:<i>")
    ap.add_argument("--run-rounds", type=int, nargs="*", default=[3, 10],
                    help="rounds of the in-process FedAMP runs whose models the precision check uses (none: skip)")
    ap.add_argument("--out", type=Path, default=None, help="write table.md and results.json here")
    args = ap.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error(f"--device {args.device}: no CUDA device is visible")
    sizes = SIZES[args.sizes]
    gpu = f", {torch.cuda.get_device_name(device)}" if device.type == "cuda" else ""
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} cores{gpu}, "
          f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}; median of {args.repeats} after a warm-up", flush=True)
    rows = aggregation_table(sizes, args.repeats, progress=lambda s: print("  " + s, flush=True), device=device)
    table = format_table(rows)
    precision = [random_precision(m, d) for m, d in sizes] + (run_precision(args.run_rounds) if args.run_rounds else [])
    text = (f"Server aggregation per round on {device}{gpu}, time (ratio to the two-GEMM limit), "
            f"{torch.get_num_threads()} torch threads:\n\n"
            f"{table}\n\nFedAMP's weights ξ and models u from float32 models, largest absolute differences:\n\n"
            f"{format_precision(precision)}")
    print("\n" + text)
    if args.out is not None:
        from benchmarks.common import save

        save(args.out, text, {"sizes": sizes, "repeats": args.repeats, "threads": torch.get_num_threads(), "device": str(device),
                              "load": os.getloadavg(), "rows": rows, "fedamp_precision": precision})


if __name__ == "__main__":
    main()
