"""Checkpoints of a whole run, and resuming one.

Every ``checkpoint-every`` rounds (and after the last), ``<results folder>/checkpoint.safetensors``
receives the run's complete server state (see ``flower_pfl.run.tensor_files``): our strategies' method
state (every client's model, global model, control variates, attention module, ...), the
sampling generators, the global arrays and the inner state of Flower's own strategies (FedAvgM's
momentum, FedAdam's moments), the node ids' partition ids, and where the results files stood.
``resume-from`` names a results folder: the run continues after its last checkpointed round and
writes into the same folder.
"""

from __future__ import annotations

from collections.abc import Mapping
from logging import WARNING
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord
from flwr.common import Parameters, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.common.logger import log

from flower_pfl.engine.sampling import Sampler
from flower_pfl.experiment.config import ConfigError, ExperimentConfig, current_values
from flower_pfl.run import tensor_files
from flower_pfl.run.results import CHECKPOINT, RunRecorder
from server_apps.guard import ReplyGuard

#: run-config keys that may differ between a run and its resumption
MAY_DIFFER = ("resume-from", "device", "output-dir", "verbose", "client-state-dir", "allow-empty-client-state",
              "tracker", "tracker-experiment", "tracker-uri", "tracker-group", "target-accuracy")
#: inner state of Flower's own strategies (both APIs), by attribute name
FLOWER_STATE = ("current_arrays", "momentum_vector", "m_t", "v_t", "current_weights", "initial_parameters")


def flower_state(strategy: Any) -> dict[str, Any]:
    """The inner state of one of Flower's strategies (FedAvgM's momentum, FedAdam's moments, ...)."""
    out: dict[str, Any] = {}
    for name in FLOWER_STATE:
        value = getattr(strategy, name, None)
        if isinstance(value, ArrayRecord):
            out[name] = {"ArrayRecord": {k: v.numpy() for k, v in value.items()}}
        elif isinstance(value, Parameters):
            out[name] = {"Parameters": parameters_to_ndarrays(value)}
        elif value is not None:
            out[name] = {"plain": value}
    return out


def set_flower_state(strategy: Any, state: Mapping[str, Any]) -> None:
    for name, packed in state.items():
        if "ArrayRecord" in packed:
            value: Any = ArrayRecord({k: Array(np.asarray(v)) for k, v in packed["ArrayRecord"].items()})
        elif "Parameters" in packed:
            value = ndarrays_to_parameters(list(packed["Parameters"]))
        else:
            value = packed["plain"]
        setattr(strategy, name, value)


class Checkpointer:
    """Writes ``strategy``'s state (and the run's) every ``every`` rounds; 0 writes only after the last."""

    def __init__(self, out: Path, every: int, strategy: Any, recorder: RunRecorder, run_config: Mapping[str, Any],
                 ranks: Mapping[Any, int], layout: Mapping[str, list[int]], sampler: Sampler, run_key: str,
                 guard: ReplyGuard | None = None) -> None:
        self.path = out / CHECKPOINT
        self.every, self.strategy, self.recorder, self.sampler, self.run_key = every, strategy, recorder, sampler, run_key
        #: the reply checks in front of Flower's own strategies (their weight book is part of the state)
        self.guard = guard
        self.run_config, self.ranks, self.layout = dict(run_config), dict(ranks), dict(layout)

    def due(self, server_round: int) -> bool:
        return self.every > 0 and server_round % self.every == 0

    def save(self, server_round: int, arrays: Mapping[str, np.ndarray] | None) -> None:
        """The state after ``server_round``; ``arrays``: the global arrays Flower's loop holds."""
        tensors: dict[str, Any] = {}
        server = getattr(self.strategy, "server", None)
        meta = {
            "round": server_round, "config": self.run_config, "layout": self.layout,
            "ranks": [[node, part] for node, part in self.ranks.items()], "elapsed": self.recorder.elapsed,
            "sampler": self.sampler.state(), "run-key": self.run_key,
            "server": tensor_files.pack(server.get_state(), "server", tensors) if server is not None else None,
            "flower": tensor_files.pack(flower_state(self.strategy), "flower", tensors) if server is None else None,
            "guard": self.guard.weights.get_state() if self.guard is not None else None,
            "arrays": tensor_files.pack(dict(arrays) if arrays is not None else None, "arrays", tensors),
        }
        tensor_files.write(self.path, tensors, meta)
        if server is not None:
            server.method.checkpoint_written()


class Resumption:
    """A checkpoint read back: checked against the new run's config and model, node ids translated."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder).expanduser().resolve()
        path = self.folder / CHECKPOINT
        if not path.exists():
            raise ConfigError(f"run config 'resume-from' = {str(folder)!r} is invalid: {path} does not exist "
                              "(a results folder of a run that wrote a checkpoint)")
        self.tensors, self.meta = tensor_files.read(path)
        self.round: int = self.meta["round"]

    def check(self, run_config: Mapping[str, Any], layout: Mapping[str, list[int]]) -> None:
        """Refuse a run config or model that differs from the checkpointed run's, naming what differs."""
        saved = {**ExperimentConfig().to_run_config(), **current_values(self.meta["config"])}  # keys it predates: defaults
        differ = sorted(k for k in set(saved) | set(run_config) if k not in MAY_DIFFER and saved.get(k) != run_config.get(k))
        if differ:
            what = ", ".join(f"'{k}' = {run_config.get(k)!r} (checkpoint: {saved.get(k)!r})" for k in differ)
            raise ConfigError(f"run config differs from the checkpointed run in {self.folder}: {what}")
        if {k: list(v) for k, v in self.meta["layout"].items()} != {k: list(v) for k, v in layout.items()}:
            raise ConfigError(f"the model differs from the checkpointed run's: {dict(layout)} (checkpoint: {self.meta['layout']})")

    def node_ids(self, ranks: Mapping[Any, int]) -> dict[Any, Any]:
        """Old node id -> new node id, through partition ids (a new ``flwr run`` gives nodes new ids)."""
        by_partition = {part: node for node, part in ranks.items()}
        missing = sorted(part for _, part in self.meta["ranks"] if part not in by_partition)
        if missing:
            log(WARNING, "resuming without partitions %s: their state stays under their old node ids until they return", missing)
        return {node: by_partition[part] for node, part in self.meta["ranks"] if part in by_partition}

    def server_state(self, ranks: Mapping[Any, int]) -> dict[str, Any] | None:
        packed = self.meta["server"]
        if packed is None:
            return None
        return translate(tensor_files.unpack(packed, self.tensors), self.node_ids(ranks))

    def state_rounds(self) -> dict[int, int]:
        """Partition id -> the round of the last client state its client kept up to the checkpoint (clients
        of methods whose client algorithm keeps none, and clients that never trained, are not listed)."""
        packed = self.meta["server"]
        rounds = tensor_files.unpack(packed, self.tensors).get("state_rounds", {}) if packed is not None else {}
        partition = {node: part for node, part in self.meta["ranks"]}
        return {partition[node]: int(r) for node, r in rounds.items() if node in partition}

    def guard_state(self, ranks: Mapping[Any, int]) -> dict[str, Any] | None:
        """The weight book of the reply checks in front of Flower's own strategies (``None``: none saved)."""
        state = self.meta.get("guard")
        return translate(state, self.node_ids(ranks)) if state is not None else None

    def sampler_state(self) -> dict[str, Any]:
        return self.meta["sampler"]

    def flower_state(self) -> dict[str, Any]:
        packed = self.meta["flower"]
        return tensor_files.unpack(packed, self.tensors) if packed is not None else {}

    def arrays(self) -> dict[str, np.ndarray] | None:
        arrays = tensor_files.unpack(self.meta["arrays"], self.tensors)
        return {k: np.asarray(v) for k, v in arrays.items()} if arrays is not None else None


def translate(value: Any, ids: Mapping[Any, Any]) -> Any:
    """``value`` with every client id (a dict key, or a list of them) replaced by ``ids[...]``."""
    if not ids or all(k == v for k, v in ids.items()):
        return value
    if isinstance(value, dict):
        return {ids.get(k, k) if _is_id(k) else k: translate(v, ids) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(ids.get(v, v) if _is_id(v) else translate(v, ids) for v in value)
    return value


def _is_id(value: Any) -> bool:
    return isinstance(value, (int, str)) and not isinstance(value, bool)
