"""Run the ServerApp and ClientApp in one process, without Ray or a SuperLink.

``InProcessGrid`` hands every message to the ClientApp with a per-node ``Context``
(its ``state`` persists across rounds, as on a SuperNode). The server and client code
are exactly those ``flwr run`` executes, with the same messages (one per node and round;
a node hosting several clients gets their instructions in one message and trains them
as one computation, ``client_apps.hosting``); only the transport is left out, so the
same seed and layout give the same numbers as ``flwr run``. As the transport does, each
node gets its own copy of its message and the server its own copy of the reply: a mod
that edits what it receives (``secaggplus_mod``) changes nothing another node or the
server sees. Nodes take their messages one at a time, also when Flower's legacy server
sends them from several threads: on ``flwr run`` every node has a process of its own,
and nodes sharing one process at once would share its state (the global RNGs; in CPython
before 3.11.8, ``ast.parse`` run in two threads at once, as ``np.load`` does, can raise
``SystemError``, python/cpython#106905). Benchmarks use it for long runs; tests use it for
fast end-to-end checks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from copy import deepcopy
from pathlib import Path
from threading import Lock
from types import SimpleNamespace
from typing import Any, TypeVar

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from client_apps.flower_internals import TaskIdentity
from flower_pfl.experiment.config import ExperimentConfig
from strategies.records import filled

CLIENT_APP_EXCEPTION = 1  # error code in replies of a ClientApp that raised


class InProcessGrid:
    """The part of ``flwr.serverapp.Grid`` strategies use, served by a local ClientApp."""

    #: the ServerApp's nodes share its process (``server_apps.app``: what the run's memory estimate counts)
    in_process = True

    def __init__(self, client_app: ClientApp, num_nodes: int, run_config: Mapping[str, Any],
                 node_ids: Sequence[int] | None = None, node_configs: Sequence[Mapping[str, Any]] | None = None) -> None:
        """Node ``node_ids[i]`` (default ``1001 + i``) is the ``i``-th of ``num_nodes``, as in ``flwr run``'s
        simulation; ``run_config``'s ``num-clients`` spreads the clients over them (``client_apps.hosting``).
        ``node_configs``: each node's own node config instead (a deployment's, e.g. with ``partition-ids``)."""
        node_ids = list(node_ids) if node_ids is not None else [1001 + i for i in range(num_nodes)]
        if len(node_ids) != num_nodes or len(set(node_ids)) != num_nodes:
            raise ValueError("need one distinct node id per node")
        configs = list(node_configs) if node_configs is not None else [{"partition-id": i, "num-partitions": num_nodes}
                                                                       for i in range(num_nodes)]
        self.client_app = client_app
        self._one_at_a_time = Lock()
        self.run = SimpleNamespace(run_id=1)  # what Flower's legacy ``start_grid`` reads
        self.contexts = {nid: Context(run_id=1, node_id=nid, node_config=dict(config), state=RecordDict(),
                                      run_config=dict(run_config))
                         for nid, config in zip(node_ids, configs, strict=True)}

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        return [self._one(msg) for msg in messages]

    def _one(self, msg: Message) -> Message:
        """The node's reply to its own copy of ``msg`` (a message may be one object for several nodes), copied
        back. Copies share the arrays' bytes, which nobody can change."""
        received = transported(msg)
        try:
            with self._one_at_a_time:
                reply = self.client_app(received, self.contexts[msg.metadata.dst_node_id])
            return transported(reply)
        except Exception as err:  # a failing node must not stop the round
            return Message(Error(code=CLIENT_APP_EXCEPTION, reason=repr(err)), reply_to=received)


#: Flower's records whose values are scalars, strings, bytes or lists of them
_VALUE_RECORDS = (MetricRecord, ConfigRecord)


def transported(msg: Message) -> Message:
    """``deepcopy(msg)``, taken apart directly (several times faster): what the transport delivers. Records
    shared within the message are shared within the copy (a node's clients that were sent one model receive
    one), and arrays share their bytes, which nobody can change. What is not one of Flower's records goes
    through ``deepcopy``."""
    made = _shallow(msg)
    for name in ("_metadata", "_error"):
        if made.__dict__.get(name) is not None:
            made.__dict__[name] = _shallow(made.__dict__[name])  # scalars and strings only
    if (content := made.__dict__.get("_content")) is not None:
        memo: dict[int, Any] = {}
        made.__dict__["_content"] = filled(RecordDict(), {name: _record(record, memo) for name, record in content.items()})
    return made


def _record(record: Any, memo: dict[int, Any]) -> Any:
    """A copy of one of a message's records (the one made before, for a record the message holds twice)."""
    if (known := memo.get(id(record))) is not None:
        return known
    kind = type(record)
    if kind is ArrayRecord:
        made = filled(ArrayRecord(), {name: _shallow(array) if type(array) is Array else deepcopy(array) for name, array in record.items()})
    elif kind in _VALUE_RECORDS:
        made = filled(kind(), {name: list(value) if type(value) is list else value for name, value in record.items()})
    else:
        made = deepcopy(record)
    memo[id(record)] = made
    return made


T = TypeVar("T")


def _shallow(obj: T) -> T:
    """A new ``obj`` with the same attributes (Flower's message parts hold everything in their ``__dict__``)."""
    made = object.__new__(type(obj))
    made.__dict__.update(vars(obj))
    return made


def in_process_grid(client_app: ClientApp, num_nodes: int, run_config: Mapping[str, Any],
                    node_ids: Sequence[int] | None = None, node_configs: Sequence[Mapping[str, Any]] | None = None) -> InProcessGrid:
    """An ``InProcessGrid``, with the task identity Flower's messages need set as in a ServerApp."""
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    return InProcessGrid(client_app, num_nodes, run_config, node_ids, node_configs)


def run_in_process(overrides: Mapping[str, Any], num_clients: int = 100, num_nodes: int | None = None,
                   node_ids: Sequence[int] | None = None) -> Path:
    """Run one experiment (defaults from ``ExperimentConfig`` plus ``overrides``) of ``num_clients`` clients on
    ``num_nodes`` nodes; returns its results folder. By default one node hosts them all and trains each
    round's clients as one computation (the legacy API: one node per client, ``server_apps.client_grid``);
    a ``num-clients`` other than 0 in ``overrides`` wins."""
    from client_apps.app import app as client_app
    from server_apps.app import run_experiment

    if num_nodes is None:
        num_nodes = num_clients if overrides.get("api") == "legacy" else 1
    run_config = {**ExperimentConfig().to_run_config(), **overrides}
    if not run_config["num-clients"]:  # a full run config's default (0) leaves the layout to the arguments
        run_config["num-clients"] = 0 if num_clients == num_nodes else num_clients
    return run_experiment(in_process_grid(client_app, num_nodes, run_config, node_ids), run_config)  # type: ignore[arg-type]
