"""What a run costs, as pFL-Bench reports it: the bytes its messages carry, the clients' training time and
the peak memory of the server and the nodes (``docs/evaluation.md#cost``).

A round's row in ``metrics.jsonl`` (train and evaluate) holds ``bytes-down`` / ``bytes-up`` (the round's
messages to and from the nodes), their means over the round's clients (``-per-client``), the server's
``peak-memory-mib`` and the nodes' ``node-peak-memory-mib`` (the largest of the round's replies); a train
row also holds ``train-time-s``, the plain mean of the clients' training seconds. ``cost_summary`` makes
the run's figures from its rows.
"""

from __future__ import annotations

import math
import resource
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: a round's bytes to and from the nodes, and their means over the round's clients
BYTES_DOWN, BYTES_UP = "bytes-down", "bytes-up"
BYTES_DOWN_PER_CLIENT, BYTES_UP_PER_CLIENT = "bytes-down-per-client", "bytes-up-per-client"
#: a client's seconds of local training in one round (in its training reply; a row's: the plain mean)
TRAIN_TIME = "train-time-s"
#: the server process's peak resident memory, MiB
PEAK_MEMORY = "peak-memory-mib"
#: a node's peak resident memory, MiB (in its replies; a row's: the largest)
NODE_PEAK_MEMORY = "node-peak-memory-mib"
#: reply metrics a round combines otherwise than by the sample-weighted mean (``reply_cost``)
NOT_WEIGHTED = (TRAIN_TIME, NODE_PEAK_MEMORY)
#: a round row's cost figures
COST_KEYS = (BYTES_DOWN, BYTES_UP, BYTES_DOWN_PER_CLIENT, BYTES_UP_PER_CLIENT, TRAIN_TIME, PEAK_MEMORY, NODE_PEAK_MEMORY)
#: figures measured while the run goes, which differ from one run of the same config to the next
MEASURED = (TRAIN_TIME, PEAK_MEMORY, NODE_PEAK_MEMORY)
#: the summary's measured figures (``cost_summary``)
MEASURED_SUMMARY = ("train_time_per_client_round_s", "peak_memory_server_mib", "peak_memory_node_mib")

_MIB = 1024.0 * 1024.0


def peak_rss_mib() -> float:
    """This process's peak resident memory in MiB (``ru_maxrss``: KiB on Linux, bytes on macOS)."""
    peak = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return peak / _MIB if sys.platform == "darwin" else peak / 1024.0


def traffic_metrics(down: Sequence[int], up: Sequence[int]) -> dict[str, float]:
    """A round's byte figures from the bytes of each client's instruction (``down``) and reply (``up``);
    a direction without messages has 0 bytes and no per-client mean."""
    out = {BYTES_DOWN: float(sum(down)), BYTES_UP: float(sum(up))}
    if down:
        out[BYTES_DOWN_PER_CLIENT] = float(sum(down)) / len(down)
    if up:
        out[BYTES_UP_PER_CLIENT] = float(sum(up)) / len(up)
    return out


def reply_cost(rows: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """The round's figures of its clients' ``NOT_WEIGHTED`` metrics: ``train-time-s``, the plain mean over the
    clients that report it; ``node-peak-memory-mib``, the largest (finite numbers only)."""
    times: list[float] = []
    peaks: list[float] = []
    for row in rows:
        for key, into in ((TRAIN_TIME, times), (NODE_PEAK_MEMORY, peaks)):
            value = row.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                into.append(float(value))
    return {**({TRAIN_TIME: sum(times) / len(times)} if times else {}), **({NODE_PEAK_MEMORY: max(peaks)} if peaks else {})}


def cost_summary(rows: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """The run's cost from its ``metrics.jsonl`` rows (every round, those before a resume included):
    ``bytes_down_total``, ``bytes_up_total``, ``bytes_total`` (sums over train and evaluate rows),
    ``bytes_down_per_client_round`` / ``bytes_up_per_client_round`` (a client's bytes in a training round,
    averaged over the train rows), ``train_time_per_client_round_s`` (the mean of the train rows'
    ``train-time-s``, each weighted by its round's clients), ``peak_memory_server_mib`` and
    ``peak_memory_node_mib`` (the largest over the rows). A figure no row has is left out."""
    down = up = 0.0
    seen_bytes = False
    per_client: dict[str, list[float]] = {BYTES_DOWN_PER_CLIENT: [], BYTES_UP_PER_CLIENT: []}
    time_sum = time_weight = 0.0
    peaks: dict[str, list[float]] = {PEAK_MEMORY: [], NODE_PEAK_MEMORY: []}
    for row in rows:
        if BYTES_DOWN in row or BYTES_UP in row:
            seen_bytes = True
            down += float(row.get(BYTES_DOWN, 0.0))
            up += float(row.get(BYTES_UP, 0.0))
        for key, values in peaks.items():
            if key in row:
                values.append(float(row[key]))
        if row.get("phase") != "train":
            continue
        for key, values in per_client.items():
            if key in row:
                values.append(float(row[key]))
        if TRAIN_TIME in row:
            clients = float(row.get("clients-accepted", 1.0)) or 1.0
            time_sum += clients * float(row[TRAIN_TIME])
            time_weight += clients
    out: dict[str, float] = {}
    if seen_bytes:
        out.update(bytes_down_total=down, bytes_up_total=up, bytes_total=down + up)
    for key, name in ((BYTES_DOWN_PER_CLIENT, "bytes_down_per_client_round"), (BYTES_UP_PER_CLIENT, "bytes_up_per_client_round")):
        if per_client[key]:
            out[name] = sum(per_client[key]) / len(per_client[key])
    if time_weight:
        out["train_time_per_client_round_s"] = time_sum / time_weight
    for key, name in ((PEAK_MEMORY, "peak_memory_server_mib"), (NODE_PEAK_MEMORY, "peak_memory_node_mib")):
        if peaks[key]:
            out[name] = max(peaks[key])
    return out
