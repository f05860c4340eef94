"""What both APIs' strategies say about a round's trainers and the replies they cannot use."""

from __future__ import annotations

from collections.abc import Sequence
from logging import INFO, WARNING
from typing import Any

from flwr.common.logger import log

from flower_pfl.engine.method_server import MethodServer
from flower_pfl.engine.reply_checks import ClientAlgorithmNotRun, RawReply, RoundReplies
from flower_pfl.engine.wording import agreeing, counted


def log_trainers(step: str, server_round: int, trainers: int, noun: str, lost: int) -> None:
    """``configure_train: 3 nodes train``; a warning when none does (none available, ``lost`` of them lost):
    the round then changes nothing."""
    if trainers:
        log(INFO, "%s: %s %s", step, counted(trainers, noun), agreeing(trainers, "trains", "train"))
        return
    besides = f" besides the {counted(lost, noun)} lost" if lost else ""
    log(WARNING, "%s: round %s: no %s trains (none connected%s); the round changes nothing", step, server_round, noun, besides)


def log_rejected(client_id: Any, server_round: int, reason: str) -> None:
    log(WARNING, "round %s: update of client %s rejected (%s); its stored model is unchanged", server_round, client_id, reason)


def receive_round(server: MethodServer, server_round: int, raws: Sequence[RawReply], batch: RoundReplies, strategy: str) -> None:
    """Check a round's training replies (``MethodServer.receive``), log each refusal, and say once
    when the clients do not run the method's client algorithm (``ClientAlgorithmNotRun`` when none does and
    the method cannot work without it; a warning when it still runs, as another method)."""
    server.receive(raws, batch)
    for client_id, reason in batch.rejections:
        log_rejected(client_id, server_round, reason)
    if (problem := server.missing_algorithm_problem(batch)) is not None:
        log(WARNING, "%s: %s", strategy, problem[0])
        if problem[1]:
            raise ClientAlgorithmNotRun(f"round {server_round}: {problem[0]}")
    if (ignored := server.ignored_algorithm_problem(batch)) is not None:
        log(WARNING, "%s: round %s: %s", strategy, server_round, ignored)
