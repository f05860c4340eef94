"""Run the ServerApp and ClientApp in one process, without Ray or a SuperLink.

``InProcessGrid`` hands every message straight to the ClientApp with a per-node
``Context`` (its ``state`` persists across rounds, as on a SuperNode). The server
and client code are exactly those ``flwr run`` executes; only the transport is
left out. Benchmarks use it for long runs; tests use it for fast end-to-end checks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp

from client_apps.flower_internals import TaskIdentity
from flower_pfl.experiment.config import ExperimentConfig

CLIENT_APP_EXCEPTION = 1  # error code in replies of a ClientApp that raised


class InProcessGrid:
    """The part of ``flwr.serverapp.Grid`` strategies use, served by a local ClientApp."""

    def __init__(self, client_app: ClientApp, num_nodes: int, run_config: Mapping[str, Any],
                 node_ids: Sequence[int] | None = None) -> None:
        """Node ``node_ids[i]`` (default ``1001 + i``) holds partition ``i``."""
        node_ids = list(node_ids) if node_ids is not None else [1001 + i for i in range(num_nodes)]
        if len(node_ids) != num_nodes or len(set(node_ids)) != num_nodes:
            raise ValueError("need one distinct node id per node")
        self.client_app = client_app
        self.run = SimpleNamespace(run_id=1)  # what Flower's legacy ``start_grid`` reads
        self.contexts = {
            nid: Context(
                run_id=1, node_id=nid,
                node_config={"partition-id": i, "num-partitions": num_nodes},
                state=RecordDict(), run_config=dict(run_config),
            )
            for i, nid in enumerate(node_ids)
        }

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        replies = []
        for msg in messages:
            try:
                replies.append(self.client_app(msg, self.contexts[msg.metadata.dst_node_id]))
            except Exception as err:  # a failing client must not stop the round
                replies.append(Message(Error(code=CLIENT_APP_EXCEPTION, reason=repr(err)), reply_to=msg))
        return replies


def in_process_grid(client_app: ClientApp, num_nodes: int, run_config: Mapping[str, Any],
                    node_ids: Sequence[int] | None = None) -> InProcessGrid:
    """An ``InProcessGrid``, with the task identity Flower's messages need set as in a ServerApp."""
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    return InProcessGrid(client_app, num_nodes, run_config, node_ids)


def run_in_process(overrides: Mapping[str, Any], num_nodes: int = 100, node_ids: Sequence[int] | None = None) -> Path:
    """Run one experiment (defaults from ``ExperimentConfig`` plus ``overrides``); returns its results folder."""
    from client_apps.app import app as client_app
    from server_apps.app import run_experiment

    run_config = {**ExperimentConfig().to_run_config(), **overrides}
    return run_experiment(in_process_grid(client_app, num_nodes, run_config, node_ids), run_config)  # type: ignore[arg-type]
