"""Each client's state between messages: its own, as before the round until it answers.

A method's client state (SCAFFOLD's c_i, Ditto's personal model, ...) belongs to one client, and a
client that fails a message keeps the state it had before it (``open`` gives a message a copy of the
client's state; ``keep`` makes it the client's once the client answered):

- a node that is its own one client keeps it in its ``context.state``, as in any Flower app (and in a
  file per training round, for a resumed run: ``persisted_state``);
- a node that hosts several clients (``client_apps.hosting``) keeps each client's state only in its
  files, ``persisted_state``'s ``<client-state-dir>/<run>/partition-<id>/round-<r>.safetensors``, and
  in its ``context.state`` only the round of each client's latest file (``ROUNDS``). Flower sends a
  node's ``Context`` with each of its messages (to a Ray actor, to a SuperNode's ClientApp process, and
  back), so what a message carries and what a node holds grow with the clients the message names, not
  with the clients the node hosts. A client whose file is gone (a Ray cluster whose ``client-state-dir``
  is not shared by its machines) fails, naming the file. Without a run key (a server that is not this
  package's) the node keeps each client's records in its ``context.state`` under ``c<id>/``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from flwr.app import ConfigRecord, Context, MessageType, RecordDict

from client_apps import persisted_state
from flower_pfl.engine.client_algorithm import RESUMED_AFTER, SERVER_ROUND

#: a node's record of its clients' latest state files: client id (text) -> round
ROUNDS = "pfl.state-rounds"
#: a client's entry under ``ROUNDS`` once its folder was found to hold no state
NONE_KEPT = -1
_PREFIX = "c{}/"


def state_node_config(node_config: Mapping[str, Any], client_state_dir: str) -> dict[str, Any]:
    """The node config the client state is read with: the run config's ``client-state-dir`` where the node
    config names none (a Ray cluster's actors)."""
    return {**({"client-state-dir": client_state_dir} if client_state_dir else {}), **node_config}


class ClientStates:
    """The state of the clients a node's message names (see the module)."""

    def __init__(self, node: Context, node_config: Mapping[str, Any], checkpoint_every: int, hosted: bool) -> None:
        """``node``: the node's ``Context``; ``node_config``: ``state_node_config``'s; ``hosted``: the node
        hosts several clients (else it is its own one client)."""
        self.node, self.node_config = node, node_config
        self.checkpoint_every, self.hosted = checkpoint_every, hosted

    def open(self, client: int, num_clients: int, config: Mapping[str, Any], phase: str) -> Context:
        """``client``'s ``Context`` for a message of ``phase`` with ``config``: its node config says its
        ``partition-id`` and the federation's ``num-partitions``, its state is a copy of the client's."""
        node = self.node
        if not self.hosted:
            state = RecordDict(dict(node.state.items()))
        elif not persisted_state.keyed(config):
            prefix = _PREFIX.format(client)
            state = RecordDict({k[len(prefix):]: r for k, r in node.state.items() if k.startswith(prefix)})
        else:
            state = RecordDict()
            known = self._rounds().get(str(client))
            last = int(known) if isinstance(known, int) and known != NONE_KEPT else None
            if known is None and phase != MessageType.QUERY:  # the client's first message in this node's Context
                after = int(config[RESUMED_AFTER]) if RESUMED_AFTER in config else None
                last = persisted_state.latest(self._folder(config, client), after)
                if last is None:  # looked once: a method that keeps no state has its folder never read again
                    self._remember(client, NONE_KEPT)
            if last is not None:
                persisted_state.load(state, self._folder(config, client), last)
        if not self.hosted and phase != MessageType.QUERY:
            persisted_state.restore(state, self.node_config, config, client)
        return Context(run_id=node.run_id, node_id=node.node_id,
                       node_config={**node.node_config, "partition-id": client, "num-partitions": num_clients},
                       state=state, run_config=node.run_config)

    def keep(self, client: int, context: Context, config: Mapping[str, Any], phase: str) -> None:
        """``client`` answered its message of ``phase`` (``config``) with ``context``'s state: it is the client's
        now (after training, written to its file; an ``OSError`` there fails the client where the file is
        all the node keeps)."""
        state, node = context.state, self.node
        server_round = int(config.get(SERVER_ROUND, 0))
        if not self.hosted:
            node.state.clear()
            node.state.update(state)
            if phase == MessageType.TRAIN:
                persisted_state.persist(state, self.node_config, config, client, server_round, self.checkpoint_every)
        elif not persisted_state.keyed(config):
            prefix = _PREFIX.format(client)
            for key in [k for k in node.state if k.startswith(prefix)]:
                del node.state[key]
            for name, record in state.items():
                node.state[prefix + name] = record
        elif phase == MessageType.TRAIN and persisted_state.write(state, self.node_config, config, client, server_round,
                                                                   self.checkpoint_every):
            self._remember(client, server_round)

    def _folder(self, config: Mapping[str, Any], client: int) -> Path:
        """``client``'s state folder under a ``config`` that is ``persisted_state.keyed``."""
        return cast(Path, persisted_state.folder(self.node_config, config, client))

    def _remember(self, client: int, server_round: int) -> None:
        """The round of ``client``'s latest file (``NONE_KEPT``: it has none)."""
        rounds = self._rounds()
        rounds[str(client)] = server_round
        self.node.state[ROUNDS] = rounds

    def _rounds(self) -> ConfigRecord:
        rounds = self.node.state.get(ROUNDS)
        return rounds if isinstance(rounds, ConfigRecord) else ConfigRecord()
