"""Run the ServerApp and ClientApp in one process, without Ray or a SuperLink.

``InProcessGrid`` hands every message straight to the ClientApp with a per-node
``Context`` (its ``state`` persists across rounds, as on a SuperNode). The server
and client code are exactly those ``flwr run`` executes; only the transport is
left out. Benchmarks use it for long runs; tests use it for fast end-to-end checks.

With the run config's ``batch-clients`` (the default), a round's training messages are answered
together: ``client_apps.app.train_round`` trains the clients as one computation where their client
algorithm allows (``flower_pfl.engine.batched``) and gives the replies the ClientApp would give;
otherwise they go one by one. A round's evaluation messages are answered together too
(``client_apps.app.evaluate_round``: the clients' forward passes as one computation). ``training_report``
says which path ran, and why.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from flwr.app import Context, Error, Message, MessageType, RecordDict
from flwr.clientapp import ClientApp

from client_apps.flower_internals import TaskIdentity
from flower_pfl.experiment.config import ExperimentConfig

CLIENT_APP_EXCEPTION = 1  # error code in replies of a ClientApp that raised
#: why the legacy API's clients train one by one in process
LEGACY_ONE_BY_ONE = "Flower's legacy server sends each client's training message on its own"
#: why the legacy API's clients evaluate one by one in process
LEGACY_EVALUATION = "Flower's legacy server sends each client's evaluation message on its own"
#: why the clients of a grid around another ClientApp than the package's train one by one
OTHER_CLIENT_APP = "the grid's ClientApp is not the package's: each message goes to it"


class InProcessGrid:
    """The part of ``flwr.serverapp.Grid`` strategies use, served by a local ClientApp."""

    def __init__(self, client_app: ClientApp, num_nodes: int, run_config: Mapping[str, Any],
                 node_ids: Sequence[int] | None = None) -> None:
        """Node ``node_ids[i]`` (default ``1001 + i``) holds partition ``i``; ``run_config``'s
        ``batch-clients`` (default true) trains a round's clients together where it can."""
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
        self.batch_clients = bool(run_config.get("batch-clients", True))
        #: client trainings with their round's clients as one computation, one by one, and why (trainings by reason)
        self.together = self.one_by_one = 0
        self.reasons: dict[str, int] = {}
        #: client evaluations likewise
        self.evaluated_together = self.evaluated_one_by_one = 0
        self.evaluation_reasons: dict[str, int] = {}

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        messages = list(messages)
        together = {**self._train_together(messages), **self._evaluate_together(messages)}
        return [together[i] if i in together else self._one(msg) for i, msg in enumerate(messages)]

    def _one(self, msg: Message) -> Message:
        if msg.metadata.message_type == MessageType.TRAIN:
            self.one_by_one += 1
        elif msg.metadata.message_type == MessageType.EVALUATE:
            self.evaluated_one_by_one += 1
        try:
            return self.client_app(msg, self.contexts[msg.metadata.dst_node_id])
        except Exception as err:  # a failing client must not stop the round
            return Message(Error(code=CLIENT_APP_EXCEPTION, reason=repr(err)), reply_to=msg)

    def _train_together(self, messages: list[Message]) -> dict[int, Message]:
        """The replies to the round's Message-API training messages, trained as one computation, by the
        messages' positions (none where they cannot be; the reason is counted)."""
        from client_apps.app import app, is_legacy, train_round

        train = [i for i, m in enumerate(messages) if m.metadata.message_type == MessageType.TRAIN]
        if not self.batch_clients or not train:
            return {}
        if self.client_app is not app:  # another ClientApp (a user's, a wrapper): it answers its own messages
            return self._refused(OTHER_CLIENT_APP, len(train))
        if any(is_legacy(messages[i]) for i in train):
            return self._refused(LEGACY_ONE_BY_ONE, len(train))
        try:
            replies, what = train_round([messages[i] for i in train], [self.contexts[messages[i].metadata.dst_node_id] for i in train])
        except Exception as err:  # e.g. one client's malformed instruction: each client gets its own reply
            replies, what = None, f"a client could not start ({err!r}): one by one"
        if replies is None:
            return self._refused(what, len(train))
        self.together += len(train)
        return dict(zip(train, replies))

    def _refused(self, why: str, trainings: int) -> dict[int, Message]:
        self.reasons[why] = self.reasons.get(why, 0) + trainings
        return {}

    def _evaluate_together(self, messages: list[Message]) -> dict[int, Message]:
        """The replies to the round's Message-API evaluation messages, their forward passes as one computation
        where they can be, by the messages' positions (none where the messages go one by one)."""
        from client_apps.app import app, evaluate_round, is_legacy

        chosen = [i for i, m in enumerate(messages) if m.metadata.message_type == MessageType.EVALUATE]
        if not self.batch_clients or not chosen:
            return {}
        why = (OTHER_CLIENT_APP if self.client_app is not app
               else LEGACY_EVALUATION if any(is_legacy(messages[i]) for i in chosen) else None)
        if why is None:
            try:
                replies, reasons = evaluate_round([messages[i] for i in chosen],
                                                  [self.contexts[messages[i].metadata.dst_node_id] for i in chosen])
            except Exception as err:  # e.g. one client's malformed instruction: each client gets its own reply
                why = f"a client could not start ({err!r}): one by one"
            else:
                for reason in reasons:  # answered here; a forward pass on its own counts as one by one
                    if reason is None:
                        self.evaluated_together += 1
                    else:
                        self.evaluated_one_by_one += 1
                        self.evaluation_reasons[reason] = self.evaluation_reasons.get(reason, 0) + 1
                return dict(zip(chosen, replies))
        self.evaluation_reasons[why] = self.evaluation_reasons.get(why, 0) + len(chosen)
        return {}

    def training_report(self) -> dict[str, Any]:
        """How the run's training messages were answered: as one computation, or one by one and why."""
        return {"clients_trained_together": self.together, "clients_trained_one_by_one": self.one_by_one,
                **({"one_by_one_because": dict(self.reasons)} if self.reasons else {}),
                "clients_evaluated_together": self.evaluated_together, "clients_evaluated_one_by_one": self.evaluated_one_by_one,
                **({"evaluated_one_by_one_because": dict(self.evaluation_reasons)} if self.evaluation_reasons else {})}


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
