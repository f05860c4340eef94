"""Client state on the node's disk, so a resumed run, and a node that rejoins, gets it back.

A method's client state (SCAFFOLD's c_i, Ditto's and APFL's personal models, pFedMe's θ_i,
IGFL-C's last delta, FedMCSA's remembered anchor) lives in ``context.state``, which belongs to
one ``flwr run`` (``client_apps.client_states``: where a node hosts several clients, only in these
files). After each training round the ClientApp writes it, on the node's own disk,
to ``<client-state-dir>/<run>/partition-<id>/round-<r>.safetensors`` (``run``: the results
folder's name, sent by the server as ``run-key``). A resumed run's instructions carry
``resumed-after`` = the server's checkpointed round R; a node whose ``context.state`` is still
empty then loads its latest version from a round <= R: exactly the state it had when the server
wrote that checkpoint. Versions older than the one the server's last checkpoint needs are deleted.

The folder is ``client-state-dir`` in the node config (``flower-supernode --node-config
"client-state-dir='/var/lib/pfl'"``), else the run config's ``client-state-dir`` (how a simulation's
clients on a Ray cluster learn it: the environment of ``flwr run`` does not reach them), else the
environment variable ``FLOWER_PFL_CLIENT_STATE_DIR``, else ``~/.cache/flower-pfl/client-state``.

A resumed run first asks every node whether it has what the checkpoint needs (``missing``): the
server names, per partition, the round of the last state its client kept before the checkpoint; a
node without a version from that round up to the checkpoint's says so, with its folder.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from functools import lru_cache
from logging import WARNING
from pathlib import Path
from typing import Any

import torch
from flwr.app import ConfigRecord, RecordDict
from flwr.common.logger import log

from client_apps.own_loop import RecordState
from flower_pfl.engine.client_algorithm import RESUMED_AFTER, RUN_KEY
from flower_pfl.run import tensor_files

_RESTORED = "flower-pfl-restored"
#: a resumed run's start-up query: partitions and the round of the client state each needs (parallel lists)
STATE_PARTITIONS, STATE_ROUNDS = "state-partitions", "state-rounds"
#: the query reply's record naming what a node lacks
CLIENT_STATE = "client-state"


def state_dir(node_config: Mapping[str, Any]) -> Path:
    """The node's folder for persisted client state."""
    return _state_dir(str(node_config.get("client-state-dir", "")), os.environ.get("FLOWER_PFL_CLIENT_STATE_DIR", ""))


@lru_cache(maxsize=16)
def _state_dir(configured: str, environment: str) -> Path:
    """``state_dir`` of a node config's and the environment's folders (made once: every client's every message asks)."""
    return Path(configured or environment or Path.home() / ".cache" / "flower-pfl" / "client-state").expanduser()


def missing(node_config: Mapping[str, Any], config: Mapping[str, Any], partition_id: int, needed: int) -> str | None:
    """Why this node cannot restore the client state of round ``needed`` (a resumed run's start-up
    check; ``config`` carries the run key and the checkpoint's round), else ``None``."""
    state_folder = folder(node_config, config, partition_id)
    if state_folder is None:
        return None
    after = int(config[RESUMED_AFTER])
    if any(needed <= r <= after for r in _versions(state_folder)):
        return None
    return f"partition {partition_id}: no client state of round {needed} (to {after}) in {state_folder}"


def _versions(folder: Path) -> dict[int, Path]:
    out = {}
    for path in folder.glob("round-*.safetensors"):
        match = re.fullmatch(r"round-(\d+)\.safetensors", path.name)
        if match:
            out[int(match.group(1))] = path
    return out


def folder(node_config: Mapping[str, Any], config: Mapping[str, Any], partition_id: int) -> Path | None:
    """The folder of ``partition_id``'s client state in the run ``config``'s run key names (``None``: no run
    key, as from a user's own strategy, or one that is not a plain folder name: ``keyed``)."""
    if not keyed(config):
        return None
    return state_dir(node_config) / str(config[RUN_KEY]) / f"partition-{partition_id}"


def keyed(config: Mapping[str, Any]) -> bool:
    """Whether ``config`` names a run key that can be a folder's name (its clients' states have a ``folder``)."""
    run = str(config.get(RUN_KEY, ""))
    return bool(_PLAIN.fullmatch(run)) and run not in (".", "..")


_PLAIN = re.compile(r"[A-Za-z0-9._+-]+")


def latest(state_folder: Path, after: int | None) -> int | None:
    """The round of the latest version in ``state_folder`` (up to round ``after`` where given: a resumed
    run's checkpointed round, whose later versions, written by the run that crashed, are deleted), or
    ``None`` when there is none."""
    versions = []
    for r, path in _versions(state_folder).items():
        if after is None or r <= after:
            versions.append(r)
        else:
            path.unlink(missing_ok=True)
    return max(versions, default=None)


def load(records: RecordDict, state_folder: Path, server_round: int) -> None:
    """Put the version of ``server_round`` into ``records`` (a client's ``context.state``);
    ``FileNotFoundError`` naming the file when it is not there."""
    path = state_folder / f"round-{server_round}.safetensors"
    try:
        tensors, meta = tensor_files.read(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"the client state of round {server_round} is not in {state_folder} (a node's clients "
                                "keep their state in files on the machine that trained them: on a Ray cluster, "
                                "client-state-dir must be a folder every machine shares)") from None
    state = RecordState(records)
    for key, names in meta["entries"].items():
        state[key] = [tensors[name] for name in names]


def restore(records: RecordDict, node_config: Mapping[str, Any], config: Mapping[str, Any], partition_id: int) -> None:
    """Fill a new ``context.state`` (once) with the latest version the client kept in this run: in a
    resumed run, the version the server's checkpoint needs; on a node that rejoins a run (a SuperNode
    restarted on the same machine), the version it last kept."""
    if _RESTORED in records.config_records:
        return
    records[_RESTORED] = ConfigRecord({"done": True})
    state_folder = folder(node_config, config, partition_id)
    if state_folder is None or len(RecordState(records)):
        return
    after = int(config[RESUMED_AFTER]) if RESUMED_AFTER in config else None
    if (last := latest(state_folder, after)) is not None:
        load(records, state_folder, last)


def persist(records: RecordDict, node_config: Mapping[str, Any], config: Mapping[str, Any], partition_id: int,
            server_round: int, checkpoint_every: int) -> None:
    """``write``, where a node's ``context.state`` holds the state and the file is only for a later resumption:
    a failed write is a warning."""
    try:
        write(records, node_config, config, partition_id, server_round, checkpoint_every)
    except OSError as err:  # the round's result still counts; only a later resumption would miss this version
        log(WARNING, "could not keep the client state on disk (%s): a resumed run would start it afresh", err)


def write(records: RecordDict, node_config: Mapping[str, Any], config: Mapping[str, Any], partition_id: int,
          server_round: int, checkpoint_every: int) -> bool:
    """Write the client state after training in ``server_round`` and drop the versions no checkpoint needs;
    whether there was anything to write (a state, a run key)."""
    state = RecordState(records)
    if not len(state) or (state_folder := folder(node_config, config, partition_id)) is None:  # most methods keep none
        return False
    state_folder.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    entries: dict[str, list[str]] = {}
    for key in state:
        entries[key] = [f"{key}.{i}" for i in range(len(state[key]))]
        tensors.update(zip(entries[key], state[key]))
    tensor_files.write(state_folder / f"round-{server_round}.safetensors", tensors, {"entries": entries})
    # the server's last checkpoint is of round ((r - 1) // k) * k (none but the final one for k = 0)
    needed = ((server_round - 1) // checkpoint_every) * checkpoint_every if checkpoint_every > 0 else server_round
    versions = _versions(state_folder)
    keep_from = max((r for r in versions if r <= needed), default=server_round)
    for r, path in versions.items():
        if r < keep_from:
            path.unlink(missing_ok=True)
    return True
