"""What of Flower's server-side console output a run keeps: its round loop's narration goes
(``flower_pfl.run.quiet``), the run's own progress lines, warnings and errors stay."""

from __future__ import annotations

import importlib
import os
from contextlib import AbstractContextManager
from pathlib import Path
from types import ModuleType

import flwr.server.strategy
import flwr.serverapp.strategy

import strategies.legacy
import strategies.message.method_strategy
from client_apps.flower_internals import server_compat, server_loop
from flower_pfl.run.quiet import DivertRecords, diverting, dropping


def _source(module: ModuleType) -> str:
    """A package's folder (with a trailing separator) or a module's file."""
    path = Path(module.__file__ or "")
    return str(path.parent) + os.sep if path.name == "__init__.py" else str(path)


def round_loop_sources() -> tuple[str, ...]:
    """The files that narrate rounds: Flower's strategy loops and strategies (both APIs) and this
    package's strategies (``strategies.nodes``, which says when a round waits for nodes, stays)."""
    return tuple(_source(m) for m in (flwr.serverapp.strategy, flwr.server.strategy, server_compat, server_loop,
                                      strategies.legacy, strategies.message.method_strategy))


def quiet_round_loop(enabled: bool = True) -> AbstractContextManager[None]:
    """Inside the block, Flower's logger drops the round loop's INFO lines (unless ``enabled`` is
    false or ``FLOWER_PFL_VERBOSE`` is set)."""
    return dropping(round_loop_sources(), enabled)


def client_failure_sources() -> list[tuple[str, str]]:
    """Where a simulation logs each failed message with its traceback, as ``(file, function)``: the
    simulation engine's message worker, its Ray backend and its actor pool (a fatal error of the engine
    itself is logged elsewhere and stays on the console)."""
    sources = []
    for module, function in [("flwr.server.superlink.fleet.vce.vce_api", "worker"),
                              ("flwr.server.superlink.fleet.vce.backend.raybackend", "process_message"),
                              ("flwr.simulation.ray_transport.ray_actor", "_fetch_future_result")]:
        try:  # Flower's simulation extra (Ray) may be absent where only a deployment runs
            sources.append((_source(importlib.import_module(module)), function))
        except ImportError:
            continue
    return sources


def divert_client_failures() -> AbstractContextManager[DivertRecords | None]:
    """Inside the block, the simulation's per-message error tracebacks leave the console
    (``flower_pfl.run.quiet.DivertRecords``; the run writes them to ``failures.log``)."""
    return diverting(client_failure_sources())
