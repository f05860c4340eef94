"""What a simulation on a Ray cluster needs that a one-machine run does not, checked at start.

Flower's Ray backend joins an existing cluster when ``RAY_ADDRESS`` is set in the environment the
local SuperLink was started with. The virtual clients then run on other machines, in the folder
``ray start`` ran in, and see nothing of the ServerApp's machine or of the environment ``flwr run``
was given: a relative path means something else on every node, and client state kept under a node's
home stays on that node. The run config must name such folders by absolute paths (the same on every
node: shared storage or the same layout).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import PurePath

from flower_pfl.experiment.config import ConfigError, ExperimentConfig
from flower_pfl.experiment.datasets.base import HUB

#: values of ``RAY_ADDRESS`` that start a Ray instance of the run's own rather than join a cluster
LOCAL = ("", "local")


def cluster_address(environ: Mapping[str, str] = os.environ) -> str | None:
    """The Ray cluster this simulation joins (``RAY_ADDRESS``), or ``None`` for a Ray of its own."""
    address = environ.get("RAY_ADDRESS", "").strip()
    return None if address in LOCAL else address


def check_cluster_paths(cfg: ExperimentConfig, environ: Mapping[str, str] = os.environ) -> None:
    """Refuse, naming the key, a relative folder the clients would read or write in a cluster run."""
    address = cluster_address(environ)
    if address is None:
        return
    folders = {"client-state-dir": cfg.client_state_dir}
    if cfg.dataset != "synthetic" and cfg.data_source == "torchvision":
        folders["data-dir"] = cfg.data_dir
    if cfg.data_source == HUB and cfg.hub_dataset.startswith((".", "~")):
        folders["hub-dataset"] = cfg.hub_dataset
    for key, value in folders.items():
        if value and not PurePath(value).is_absolute():
            raise ConfigError(f"run config '{key}' = {value!r} is invalid on a Ray cluster (RAY_ADDRESS={address}): the "
                              f"clients run on other machines, in the folder 'ray start' ran in; give an absolute path "
                              "that is the same on every node")
