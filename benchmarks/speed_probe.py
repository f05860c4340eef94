"""Timing probes for ``benchmarks/speed.py``: the package's own ServerApp and ClientApp, wrapped so
that every process of a run writes where its time goes.

``benchmarks/speed.py`` copies this file into a temporary Flower app (the project's
``pyproject.toml`` with its components pointed here), so ``flwr run`` executes exactly the package's
code with timers around it. With ``FLOWER_PFL_TIMINGS=<folder>`` in the environment, each process
appends JSON lines to ``<folder>/<pid>.jsonl``:

- ``handler`` (ClientApp, in the Ray actor or in-process): one message, wall and CPU seconds, and
  the seconds in the node's set-up, loading the received arrays, training, evaluating; the rest
  of the handler is building the reply (arrays to bytes).
- ``process`` (simulation process): Flower's ``RayBackend.process_message`` for one message, i.e.
  the handler plus Ray's dispatch, (de)serialisation of the message and context, and the actor pool.
- ``exchange`` (ServerApp): one ``grid.send_and_receive`` with the seconds spent pushing
  messages into the LinkState and pulling replies out of it.
- ``run``: the ServerApp's whole run, with the process's CPU seconds and the ServerApp thread's own.

``analyse`` turns those lines into a breakdown of a round's wall time.
"""

from __future__ import annotations

import bisect
import inspect
import json
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from statistics import median
from typing import Any

import torch
from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from client_apps import app as package_client
from server_apps.app import poll_faster, run_experiment

TIMINGS = "FLOWER_PFL_TIMINGS"
_client = threading.local()  # the handler's phases (in-process, the handler runs inside the exchange's thread)
_server = threading.local()  # the exchange's push and pull
_lock = threading.Lock()


def _write(row: Mapping[str, Any]) -> None:
    folder = os.environ.get(TIMINGS)
    if folder:
        with _lock, (Path(folder) / f"{os.getpid()}.jsonl").open("a") as fh:
            fh.write(json.dumps(row) + "\n")


@contextmanager
def _phase(holder: threading.local, name: str) -> Iterator[None]:
    t0 = time.perf_counter()
    try:
        yield
    finally:
        acc = getattr(holder, "acc", None)
        if acc is not None:
            acc[name] += time.perf_counter() - t0


def _timed_method(owner: Any, attr: str, phase: str, holder: threading.local) -> None:
    original = getattr(owner, attr)
    if getattr(original, "_probed", False):
        return

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with _phase(holder, phase):
            return original(*args, **kwargs)

    wrapper._probed = True  # type: ignore[attr-defined]
    # a classmethod's ``original`` is already bound to the class: the wrapper goes in as a static method
    setattr(owner, attr, staticmethod(wrapper) if isinstance(inspect.getattr_static(owner, attr), classmethod) else wrapper)


for _attr, _name in (("from_context", "setup"), ("load", "load"), ("fit", "train"), ("evaluate", "evaluate")):
    _timed_method(package_client.Node, _attr, _name, _client)


def _handle(kind: str, fn: Callable[[Message, Context], Message], msg: Message, context: Context) -> Message:
    _client.acc = defaultdict(float)
    start, cpu = time.time(), time.thread_time()
    try:
        return fn(msg, context)
    finally:
        _write({"row": "handler", "kind": kind, "pid": os.getpid(), "start": start, "end": time.time(),
                "cpu": time.thread_time() - cpu, "threads": torch.get_num_threads(), **_client.acc})
        _client.acc = None


# module-level functions: Ray pickles the ClientApp for every message, and these by reference
clientapp = ClientApp()


@clientapp.train()
def train(msg: Message, context: Context) -> Message:
    return _handle("train", package_client.train, msg, context)


@clientapp.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    return _handle("evaluate", package_client.evaluate, msg, context)


@clientapp.query()
def query(msg: Message, context: Context) -> Message:
    return _handle("query", package_client.query, msg, context)


def _patch_server_side() -> None:
    """Time the in-memory grid's push/pull and the Ray backend's ``process_message`` (both live in the
    simulation process that runs the ServerApp)."""
    from client_apps.flower_internals import in_memory_grid, ray_backend

    RayBackend, InMemoryGrid = ray_backend(), in_memory_grid()

    for attr in ("push_messages", "pull_messages"):
        _timed_method(InMemoryGrid, attr, attr, _server)
    original = RayBackend.process_message
    if getattr(original, "_probed", False):
        return

    def process_message(self: Any, message: Message, context: Context) -> Any:
        start = time.time()
        try:
            return original(self, message, context)
        finally:
            _write({"row": "process", "start": start, "end": time.time(), "actors": self.num_workers})

    process_message._probed = True  # type: ignore[attr-defined]
    RayBackend.process_message = process_message  # type: ignore[method-assign]


class TimedGrid:
    """A grid whose ``send_and_receive`` calls are timed (everything else passes through)."""

    def __init__(self, grid: Grid) -> None:
        self._grid = grid

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        messages = list(messages)
        kinds = {m.metadata.message_type for m in messages}
        _server.acc = defaultdict(float)
        start, cpu, own = time.time(), time.process_time(), time.thread_time()
        try:
            return self._grid.send_and_receive(messages, timeout=timeout)
        finally:
            _write({"row": "exchange", "kind": ",".join(sorted(kinds)), "n": len(messages), "start": start,
                    "end": time.time(), "process_cpu": cpu, "thread_cpu": own, **_server.acc})
            _server.acc = None


def run_timed(grid: Grid, run_config: Mapping[str, Any]) -> Path:
    """``run_experiment`` on a timed grid, with the run's wall and CPU seconds."""
    start, cpu, own = time.time(), time.process_time(), time.thread_time()
    try:
        return run_experiment(TimedGrid(grid), run_config)  # type: ignore[arg-type]
    finally:
        _write({"row": "run", "start": start, "end": time.time(), "process_cpu": time.process_time() - cpu,
                "serverapp_cpu": time.thread_time() - own})


serverapp = ServerApp()


@serverapp.main()
def main(grid: Grid, context: Context) -> None:
    _patch_server_side()
    poll_faster(grid)  # as the package's ServerApp does
    run_timed(grid, context.run_config)


# --- analysis -------------------------------------------------------------------------------------

def read(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for path in Path(folder).glob("*.jsonl") for line in path.read_text().splitlines() if line]


def analyse(rows: list[dict[str, Any]], first_round: int, last_round: int) -> dict[str, Any]:
    """Where the wall time of rounds ``first_round .. last_round`` went, in seconds per round.

    Rounds are found by their training exchanges (one per round, in order); the window runs from
    the start of round ``first_round``'s training exchange to the start of the one after
    ``last_round`` (so it holds the evaluations of those rounds). The parts add up to the window:

    - ``serverapp``: the ServerApp outside ``send_and_receive`` (sampling, aggregation, metrics, files);
    - ``push``: putting the messages into the LinkState;
    - ``dispatch wait``: from the end of the push to the first message reaching an actor;
    - ``reply wait``: from the last message leaving its actor to ``send_and_receive`` returning (the
      last look for replies included);
    - the span in between, shared out by what the actors did in it, summed over actors and divided
      by their number: the handler's phases (``setup``, ``load``, ``train``, ``evaluate``, ``reply``),
      ``ray`` (``process_message`` minus the handler: dispatch, (de)serialisation, the actor pool)
      and ``actors idle``.
    """
    exchanges = sorted((r for r in rows if r["row"] == "exchange"), key=lambda r: r["start"])
    trains = [r for r in exchanges if r["kind"] == "train"]
    if len(trains) <= last_round:
        raise ValueError(f"{len(trains)} training rounds recorded; the window needs {last_round + 1}")
    t0, t1 = trains[first_round - 1]["start"], trains[last_round]["start"]  # rounds start with their exchange: no edge cuts one
    rounds = last_round - first_round + 1
    handlers = [r for r in rows if r["row"] == "handler"]
    processes = [r for r in rows if r["row"] == "process"]
    parts: dict[str, float] = defaultdict(float)
    cpu = pulled = 0.0
    inside = [e for e in exchanges if t0 <= e["start"] < t1]
    parts["serverapp"] = (t1 - t0) - sum(e["end"] - e["start"] for e in inside)
    for e in inside:
        within = lambda rs, e=e: [r for r in rs if e["start"] <= r["start"] and r["end"] <= e["end"]]
        hs, ps = within(handlers), within(processes)
        mine = ps or hs
        if not mine:
            parts["reply wait"] += e["end"] - e["start"]
            continue
        push, pull = e.get("push_messages", 0.0), e.get("pull_messages", 0.0)
        first, last = min(m["start"] for m in mine), max(m["end"] for m in mine)
        parts["push"] += push
        pulled += pull  # the ServerApp looks for replies while the actors work: beside the parts, not one of them
        parts["dispatch wait"] += max(first - e["start"] - push, 0.0)
        parts["reply wait"] += e["end"] - last
        span = last - first
        actors = max((p["actors"] for p in ps), default=1)
        busy: dict[str, float] = defaultdict(float)
        for h in hs:
            cpu += h["cpu"]
            named = {k: h[k] for k in ("setup", "load", "train", "evaluate") if k in h}
            for k, v in named.items():
                busy[k] += v
            busy["reply"] += (h["end"] - h["start"]) - sum(named.values())
        if ps:
            busy["ray"] += sum(p["end"] - p["start"] for p in ps) - sum(h["end"] - h["start"] for h in hs)
        total = sum(busy.values()) / actors
        scale = span / total if total > span else 1.0  # clock skew between processes: never more than the span
        for k, v in busy.items():
            parts[k] += v / actors * scale
        parts["actors idle"] += max(span - total, 0.0)
    per_round = {k: v / rounds for k, v in parts.items()}
    a, b = trains[first_round - 1], trains[last_round]  # the window's edges
    server_cpu = {"process": (b.get("process_cpu", 0.0) - a.get("process_cpu", 0.0)) / rounds,
                  "serverapp thread": (b.get("thread_cpu", 0.0) - a.get("thread_cpu", 0.0)) / rounds}
    run = next((r for r in rows if r["row"] == "run"), None)
    return {"seconds_per_round": (t1 - t0) / rounds, "parts": per_round, "client_cpu_per_round": cpu / rounds,
            "server_cpu_per_round": server_cpu, "pull_per_round": pulled / rounds,
            "handler_ms": {k: 1e3 * median(h["end"] - h["start"] for h in handlers if h["kind"] == k)
                           for k in ("train", "evaluate") if any(h["kind"] == k for h in handlers)},
            "ray_ms": _ray_split(handlers, processes), "torch_threads": sorted({h.get("threads") for h in handlers}),
            "run": run}


def _ray_split(handlers: list[dict[str, Any]], processes: list[dict[str, Any]]) -> dict[str, float]:
    """Median ms of Ray's part of a message before the handler starts (submit, transfer, unpickling,
    Flower's ClientApp call) and after it ends (pickling, transfer, ``ray.get``)."""
    before, after = [], []
    ordered = sorted(handlers, key=lambda h: h["start"])
    starts = [h["start"] for h in ordered]
    for p in processes:
        lo, hi = bisect.bisect_left(starts, p["start"]), bisect.bisect_right(starts, p["end"])
        inner = [h for h in ordered[lo:hi] if h["end"] <= p["end"]]
        if len(inner) == 1:
            before.append(inner[0]["start"] - p["start"])
            after.append(p["end"] - inner[0]["end"])
    return {"before": 1e3 * median(before), "after": 1e3 * median(after)} if before else {}
