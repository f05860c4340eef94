"""Server memory and time of the per-client model stores at federation scale.

The disk store (``DiskClientModelStore``) with N clients x D parameters (default 10,000 x
1,000,000: 40 GB of float32 rows on disk), each client's row written once, in chunks; then R
rounds of FedMCSA's server algorithm on P sampled participants: their rows fetched (``get``), the
layer-wise attention of ``flower_pfl.methods.attention`` over them, with one component per tenth of
the columns, and the personalized rows written back (``put``). Then the same for the in-memory
store (``ClientModelStore``) at a size that fits in memory (default 1,000 x 1,000,000: 4 GB).

Each store runs in a fresh process, so that its peak RSS (``ru_maxrss``) is its own. By
default the disk store's files are dropped from the page cache after they are written
(``posix_fadvise``), so that the rounds read the participants from the disk, as a server
whose federation does not fit in memory would (``--keep-cache`` leaves them cached).

    python -m benchmarks.store_memory                      # 40 GB in a temporary folder under /tmp, deleted at the end
    python -m benchmarks.store_memory --dir /data/store    # the disk store in /data/store (kept)
    python -m benchmarks.store_memory --clients 2000 --memory-clients 500 --rounds 3

Then the disk store's checkpoints and resumption at the same size (``--no-resume`` skips it): the
rounds run again with a checkpoint every ``--checkpoint-every`` rounds (``snapshot``: what it costs
in time, and the undo log's extra disk before it is released), once without interruption and once
SIGKILLed in round ``--kill-in`` (after a checkpoint, with rows overwritten since), then resumed in a
new process from the last checkpoint (``rollback``); the SHA-256 of every row of both stores must
be equal.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

GB = 1e9


def _rss() -> dict[str, float]:
    """Current resident set (total, anonymous, file-backed) and peak, in bytes."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
            fields[key] = float(value.split()[0]) * 1024
    fields["ru_maxrss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0  # KiB on Linux
    return fields


def _reset_peak() -> bool:
    """Reset the peak RSS (Linux >= 4.0) so that the next peak is the rounds' own."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _evict(folder: Path) -> None:
    """Drop the store's files from the page cache (they were flushed before)."""
    for path in folder.glob("*.npy"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def run_store(kind: str, clients: int, dim: int, rounds: int, participants: int, chunk: int,
              components: int, sigma: float, folder: str | None, evict: bool, seed: int) -> dict:
    """Create the store, run the rounds; what was measured. Runs in its own process."""
    import numpy as np
    import torch

    from flower_pfl.engine.disk_store import make_store
    from flower_pfl.methods.attention import layerwise_attention

    rss_start = _rss()
    gen = torch.Generator().manual_seed(seed)
    store = make_store(torch.zeros(dim), "cpu", folder if kind == "disk" else None)

    # creation: every client's row written once, chunk by chunk. The rows are cheap affine
    # variations (own scale and shift per client) of one random (chunk, dim) matrix.
    base = torch.randn(chunk, dim, generator=gen)
    t0, write_s = time.perf_counter(), 0.0
    for first in range(0, clients, chunk):
        n = min(chunk, clients - first)
        rows = torch.addcmul(torch.randn(n, 1, generator=gen), base[:n], torch.rand(n, 1, generator=gen) + 0.5)
        t = time.perf_counter()
        store.put(list(range(first, first + n)), rows)
        write_s += time.perf_counter() - t
        del rows
    del base
    t = time.perf_counter()
    if kind == "disk":
        store.flush()  # the rows on the disk, not only in the page cache
    write_s += time.perf_counter() - t
    creation_s = time.perf_counter() - t0
    if kind == "disk" and evict:
        _evict(Path(folder))  # type: ignore[arg-type]
    rss_created = _rss()
    peak_reset = _reset_peak()

    # rounds: FedMCSA's server algorithm on the sampled participants
    width = dim // components
    slices = [slice(l * width, dim if l == components - 1 else (l + 1) * width) for l in range(components)]
    rng = np.random.default_rng(seed)
    times: dict[str, list[float]] = {"round": [], "get": [], "attention": [], "put": []}
    for _ in range(rounds):
        ids = rng.choice(clients, size=participants, replace=False).tolist()
        t0 = time.perf_counter()
        u = store.get(ids)
        t1 = time.perf_counter()
        v, _ = layerwise_attention(u, slices, sigma)
        del u
        t2 = time.perf_counter()
        store.put(ids, v)
        t3 = time.perf_counter()
        del v
        for key, value in zip(times, (t3 - t0, t1 - t0, t2 - t1, t3 - t2)):
            times[key].append(value)
    rss_end = _rss()
    t = time.perf_counter()
    if kind == "disk":
        store.flush()
    flush_s = time.perf_counter() - t
    return {"kind": kind, "clients": clients, "dim": dim, "bytes": 4.0 * clients * dim,
            "capacity": store.capacity, "blocks": store.num_blocks,
            "creation_s": creation_s, "write_s": write_s, "times": times,
            "flush_s": flush_s, "rss_start": rss_start, "rss_created": rss_created, "rss_end": rss_end,
            "peak_creation": rss_created["ru_maxrss"],
            "peak_rounds": rss_end["ru_maxrss"] if peak_reset else float("nan"),
            "peak": max(rss_created["ru_maxrss"], rss_end["ru_maxrss"])}


def _in_process(**kwargs) -> dict:
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
        return pool.submit(run_store, **kwargs).result()


def run_checkpointed(mode: str, folder: str, clients: int, dim: int, rounds: int, participants: int, chunk: int,
                     components: int, sigma: float, seed: int, every: int, kill_in: int) -> dict:
    """The disk store's rounds with checkpoints: ``mode`` ``whole`` (create, run every round), ``killed``
    (create, SIGKILL itself in round ``kill_in`` after the round's rows are written) or ``resumed``
    (reopen, roll back to the last checkpoint, run the remaining rounds). A checkpoint is the store's
    snapshot plus what the rounds need to go on (a JSON file beside the store, written atomically).
    Returns the checkpoints' costs and, for ``whole`` and ``resumed``, the SHA-256 of every row."""
    import hashlib
    import json
    import signal

    import numpy as np
    import torch

    from flower_pfl.engine.disk_store import DiskClientModelStore
    from flower_pfl.methods.attention import layerwise_attention

    state_file = Path(folder).with_name(Path(folder).name + "-checkpoint.json")
    width = dim // components
    slices = [slice(l * width, dim if l == components - 1 else (l + 1) * width) for l in range(components)]
    rng = np.random.default_rng(seed)
    if mode == "resumed":
        store = DiskClientModelStore.open(folder)
        saved = json.loads(state_file.read_text())
        t = time.perf_counter()
        store.rollback(saved["snapshot"], saved["ids"])
        rollback_s, first = time.perf_counter() - t, saved["round"] + 1
        rng.bit_generator.state = saved["rng"]
    else:
        store, rollback_s, first = DiskClientModelStore(torch.zeros(dim), folder), 0.0, 1
        gen = torch.Generator().manual_seed(seed)
        base = torch.randn(chunk, dim, generator=gen)
        for start in range(0, clients, chunk):
            n = min(chunk, clients - start)
            store.put(list(range(start, start + n)), torch.addcmul(torch.randn(n, 1, generator=gen), base[:n],
                                                                    torch.rand(n, 1, generator=gen) + 0.5))
        store.flush()
    checkpoints = []
    for server_round in range(first, rounds + 1):
        ids = rng.choice(clients, size=participants, replace=False).tolist()
        store.put(ids, layerwise_attention(store.get(ids), slices, sigma)[0])
        if mode == "killed" and server_round == kill_in:
            os.kill(os.getpid(), signal.SIGKILL)
        if server_round % every == 0:
            undo = sum(p.stat().st_size for p in Path(folder).glob("undo-*"))
            t = time.perf_counter()
            token = store.snapshot()
            tmp = state_file.with_suffix(".tmp")
            tmp.write_text(json.dumps({"round": server_round, "snapshot": token, "ids": store.ids(),
                                       "rng": rng.bit_generator.state}))
            os.replace(tmp, state_file)
            store.release()
            checkpoints.append({"round": server_round, "seconds": time.perf_counter() - t, "undo_bytes": undo})
    digest = hashlib.sha256()
    t = time.perf_counter()
    ids = store.ids()
    for start in range(0, len(ids), chunk):
        digest.update(store.get(ids[start:start + chunk]).numpy().tobytes())
    return {"mode": mode, "checkpoints": checkpoints, "rollback_s": rollback_s, "sha256": digest.hexdigest(),
            "hash_s": time.perf_counter() - t, "clients": len(ids)}


def _resume_check(folder: Path, **kwargs) -> list[dict]:
    """Uninterrupted, then killed and resumed, in fresh processes (the store is deleted in between)."""
    out = []
    for mode in ("whole", "killed", "resumed"):
        if mode != "resumed":
            shutil.rmtree(folder, ignore_errors=True)
        with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
            future = pool.submit(run_checkpointed, mode, str(folder), **kwargs)
            try:
                out.append(future.result())
            except Exception as err:  # the killed process: its pool breaks
                if mode != "killed":
                    raise
                out.append({"mode": mode, "died": type(err).__name__})
        print(f"  {mode}: {out[-1] if mode == 'killed' else {k: v for k, v in out[-1].items() if k != 'checkpoints'}}",
              flush=True)
    return out


def _stats(values: list[float]) -> str:
    return f"{sum(values) / len(values):.2f} / {min(values):.2f} / {max(values):.2f}"


def report(r: dict, participants: int) -> str:
    t, s = r["times"], r["rss_end"]
    flush = f"; flush after the rounds {r['flush_s']:.1f} s" if r["kind"] == "disk" else ""
    lines = [
        (f"{r['kind']} store: {r['clients']:,} clients x {r['dim']:,} parameters = {r['bytes'] / GB:.1f} GB "
         f"of rows ({r['capacity']:,} rows allocated in {r['blocks']} blocks, {r['capacity'] / r['clients']:.3f}x)"),
        (f"  creation: {r['creation_s']:.1f} s, of which {r['write_s']:.1f} s in put/flush "
         f"({r['bytes'] / GB / max(r['write_s'], 1e-9):.2f} GB/s)"),
        (f"  {len(t['round'])} rounds of {participants} participants, s (mean / min / max): "
         f"round {_stats(t['round'])}; get {_stats(t['get'])}, attention {_stats(t['attention'])}, "
         f"put {_stats(t['put'])}{flush}"),
        (f"  RSS: at the start {r['rss_start']['VmRSS'] / GB:.2f} GB; after creation "
         f"{r['rss_created']['VmRSS'] / GB:.2f} GB; after the rounds {s['VmRSS'] / GB:.2f} GB "
         f"(anonymous {s['RssAnon'] / GB:.2f}, file-backed {s['RssFile'] / GB:.2f})"),
        (f"  peak RSS (ru_maxrss): {r['peak'] / GB:.2f} GB; during creation {r['peak_creation'] / GB:.2f} GB, "
         f"during the rounds {r['peak_rounds'] / GB:.2f} GB"),
    ]
    return "\n".join(lines)


def resume_report(runs: list[dict], args: argparse.Namespace) -> str:
    whole, resumed = runs[0], runs[2]
    cps = whole["checkpoints"]
    row_bytes = 4.0 * args.dim
    times = ", ".join(f"round {c['round']} {c['seconds']:.2f} s" for c in cps)
    undo = ", ".join(f"{c['undo_bytes'] / GB:.2f} GB" for c in cps)
    lines = [f"  checkpoints (snapshot + release): {times}",
             f"  undo log before each checkpoint: {undo} "
             f"(rows overwritten since the previous one: at most {args.participants * args.checkpoint_every} × "
             f"{row_bytes / 1e6:.0f} MB = {args.participants * args.checkpoint_every * row_bytes / GB:.1f} GB)",
             f"  resumed: rollback {resumed['rollback_s']:.2f} s; SHA-256 of all {resumed['clients']:,} rows "
             f"{'EQUAL to' if resumed['sha256'] == whole['sha256'] else 'DIFFERENT from'} the uninterrupted run's "
             f"({whole['sha256'][:16]}…; hashing took {whole['hash_s']:.0f} s)"]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=10_000, help="clients in the disk store")
    ap.add_argument("--dim", type=int, default=1_000_000, help="parameters per client")
    ap.add_argument("--memory-clients", type=int, default=1_000, help="clients in the in-memory store (0: skip it)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--participants", type=int, default=100, help="sampled clients per round")
    ap.add_argument("--chunk", type=int, default=100, help="clients written per put when creating a store")
    ap.add_argument("--components", type=int, default=10, help="attention components (equal column slices)")
    ap.add_argument("--sigma", type=float, default=50.0, help="FedMCSA's attention scale")
    ap.add_argument("--dir", type=Path, default=None,
                    help="folder of the disk store (must be empty or absent; kept); default: a temporary "
                         "folder under /tmp, deleted at the end")
    ap.add_argument("--keep-cache", action="store_true", help="do not drop the disk store's files from the page cache")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-resume", action="store_true", help="skip the checkpoint and SIGKILL + resume part")
    ap.add_argument("--resume-rounds", type=int, default=6, help="rounds of the checkpoint and resume part")
    ap.add_argument("--checkpoint-every", type=int, default=2)
    ap.add_argument("--kill-in", type=int, default=5, help="the round the server is SIGKILLed in (after its writes)")
    args = ap.parse_args()

    common = {"dim": args.dim, "rounds": args.rounds, "participants": args.participants, "chunk": args.chunk,
              "components": args.components, "sigma": args.sigma, "evict": not args.keep_cache, "seed": args.seed}
    load = os.getloadavg()
    print(f"{os.cpu_count()} cores; load average {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}; "
          f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / GB:.1f} GB of memory", flush=True)
    results = []
    if args.clients > 0:
        if args.dir is not None:
            if args.dir.exists() and any(args.dir.iterdir()):
                raise SystemExit(f"--dir {args.dir} is not empty")
            folder = args.dir
        else:
            folder = Path(tempfile.mkdtemp(prefix="store_memory_", dir="/tmp"))
        need, free = 4.0 * args.clients * args.dim, shutil.disk_usage(folder if folder.exists() else folder.parent).free
        if need > 0.95 * free:
            raise SystemExit(f"the disk store needs {need / GB:.1f} GB, {folder} has {free / GB:.1f} GB free")
        print(f"disk store: {args.clients:,} x {args.dim:,} ({need / GB:.1f} GB) in {folder}", flush=True)
        try:
            results.append(_in_process(kind="disk", clients=args.clients, folder=str(folder), **common))
            print(report(results[-1], args.participants), flush=True)
            if not args.no_resume:
                print(f"disk store with a checkpoint every {args.checkpoint_every} rounds, {args.resume_rounds} rounds, "
                      f"SIGKILLed in round {args.kill_in}:", flush=True)
                resume = _resume_check(folder, clients=args.clients, dim=args.dim, rounds=args.resume_rounds,
                                       participants=args.participants, chunk=args.chunk, components=args.components,
                                       sigma=args.sigma, seed=args.seed, every=args.checkpoint_every, kill_in=args.kill_in)
                print(resume_report(resume, args), flush=True)
        finally:
            if args.dir is None:
                shutil.rmtree(folder, ignore_errors=True)
                folder.with_name(folder.name + "-checkpoint.json").unlink(missing_ok=True)
    if args.memory_clients > 0:
        print(f"memory store: {args.memory_clients:,} x {args.dim:,} "
              f"({4.0 * args.memory_clients * args.dim / GB:.1f} GB)", flush=True)
        results.append(_in_process(kind="memory", clients=args.memory_clients, folder=None, **common))
        print(report(results[-1], args.participants), flush=True)

    load = os.getloadavg()
    print(f"\nload average at the end {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}\n")
    print("| store | clients x parameters | rows | peak RSS: creation / rounds | RSS after | creation "
          "| round: mean (min-max) | get / attention / put (mean) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        t = r["times"]
        mean = {k: sum(v) / len(v) for k, v in t.items()}
        print(f"| {r['kind']} | {r['clients']:,} x {r['dim']:,} | {r['bytes'] / GB:.1f} GB "
              f"| {r['peak_creation'] / GB:.2f} / {r['peak_rounds'] / GB:.2f} GB | {r['rss_end']['VmRSS'] / GB:.2f} GB "
              f"| {r['creation_s']:.1f} s | {mean['round']:.2f} s ({min(t['round']):.2f}-{max(t['round']):.2f}) "
              f"| {mean['get']:.2f} / {mean['attention']:.2f} / {mean['put']:.2f} s |")


if __name__ == "__main__":
    main()
