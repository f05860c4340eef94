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
from dataclasses import dataclass, field
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
_COULD_NOT_START = "a client could not start ({err!r}): one by one"


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
        #: how the run's training and evaluation messages were answered
        self.training, self.evaluation = Tally(), Tally()

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        messages = list(messages)
        together = {**self._train_together(messages), **self._evaluate_together(messages)}
        return [together[i] if i in together else self._one(msg) for i, msg in enumerate(messages)]

    def _one(self, msg: Message) -> Message:
        tally = {MessageType.TRAIN: self.training, MessageType.EVALUATE: self.evaluation}.get(msg.metadata.message_type)
        if tally is not None:
            tally.one_by_one += 1
        try:
            return self.client_app(msg, self.contexts[msg.metadata.dst_node_id])
        except Exception as err:  # a failing client must not stop the round
            return Message(Error(code=CLIENT_APP_EXCEPTION, reason=repr(err)), reply_to=msg)

    def _chosen(self, messages: list[Message], kind: str, tally: Tally, legacy: str) -> list[int]:
        """The positions of the round's messages of ``kind`` that the package's ClientApp answers together; none
        (the reason counted in ``tally``) for another ClientApp or the legacy API."""
        from client_apps.app import app, is_legacy

        chosen = [i for i, m in enumerate(messages) if m.metadata.message_type == kind]
        if not self.batch_clients or not chosen:
            return []
        if self.client_app is not app:  # another ClientApp (a user's, a wrapper): it answers its own messages
            tally.apart(OTHER_CLIENT_APP, len(chosen))
            return []
        if any(is_legacy(messages[i]) for i in chosen):
            tally.apart(legacy, len(chosen))
            return []
        return chosen

    def _contexts(self, messages: list[Message], chosen: list[int]) -> list[Context]:
        return [self.contexts[messages[i].metadata.dst_node_id] for i in chosen]

    def _train_together(self, messages: list[Message]) -> dict[int, Message]:
        """The replies to the round's Message-API training messages, trained as one computation, by the
        messages' positions (none where they cannot be; the reason is counted)."""
        from client_apps.app import train_round

        if not (train := self._chosen(messages, MessageType.TRAIN, self.training, LEGACY_ONE_BY_ONE)):
            return {}
        try:
            replies, what = train_round([messages[i] for i in train], self._contexts(messages, train))
        except Exception as err:  # e.g. one client's malformed instruction: each client gets its own reply
            replies, what = None, _COULD_NOT_START.format(err=err)
        if replies is None:
            self.training.apart(what, len(train))
            return {}
        self.training.together += len(train)
        return dict(zip(train, replies))

    def _evaluate_together(self, messages: list[Message]) -> dict[int, Message]:
        """The replies to the round's Message-API evaluation messages, their forward passes as one computation
        where they can be, by the messages' positions (none where the messages go one by one)."""
        from client_apps.app import evaluate_round

        if not (chosen := self._chosen(messages, MessageType.EVALUATE, self.evaluation, LEGACY_EVALUATION)):
            return {}
        try:
            replies, reasons = evaluate_round([messages[i] for i in chosen], self._contexts(messages, chosen))
        except Exception as err:  # e.g. one client's malformed instruction: each client gets its own reply
            self.evaluation.apart(_COULD_NOT_START.format(err=err), len(chosen))
            return {}
        for reason in reasons:  # answered here; a forward pass on its own counts as one by one
            if reason is None:
                self.evaluation.together += 1
            else:
                self.evaluation.one_by_one += 1
                self.evaluation.apart(reason, 1)
        return dict(zip(chosen, replies))

    def training_report(self) -> dict[str, Any]:
        """How the run's training and evaluation messages were answered: as one computation, or one by one
        and why."""
        return {**self.training.report("clients_trained", "one_by_one_because"),
                **self.evaluation.report("clients_evaluated", "evaluated_one_by_one_because")}


@dataclass
class Tally:
    """How a run's messages of one type were answered: with their round's as one computation, one by one,
    and the reasons (messages by reason)."""

    together: int = 0
    one_by_one: int = 0
    reasons: dict[str, int] = field(default_factory=dict)

    def apart(self, why: str, messages: int) -> None:
        self.reasons[why] = self.reasons.get(why, 0) + messages

    def report(self, prefix: str, because: str) -> dict[str, Any]:
        return {f"{prefix}_together": self.together, f"{prefix}_one_by_one": self.one_by_one,
                **({because: dict(self.reasons)} if self.reasons else {})}


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
