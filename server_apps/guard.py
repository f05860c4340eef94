"""Flower's own strategies (the FedAvg family) behind the reply checks this package's strategies make.

Flower's FedAvg aggregates whatever arrives: a reply with the wrong arrays, a NaN, an unreadable
array or a huge update reaches the global model or stops the run. In the package's ServerApp
their replies pass ``flower_pfl.engine.reply_checks`` first (structure, finiteness, sample count and the
update bound against the global model sent); refused replies are logged and left out.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, Message
from flwr.common import parameters_to_ndarrays

from flower_pfl.engine.layout import ParamLayout
from flower_pfl.engine.reply_checks import (
    RawReply,
    Reply,
    ReplyBounds,
    RoundReplies,
    UpdateRejected,
    WeightBook,
    check_num_examples,
    check_update,
    decoded,
    model_change,
    screen,
)
from strategies.aggregated_metrics import reply_counts
from strategies.arrays import DecodedArray, put_arrays
from strategies.failures import NodeFailures
from strategies.message.method_strategy import raw_reply
from strategies.nodes import split_replies
from strategies.records import records
from strategies.replies import log_rejected


class ReplyGuard:
    """Checks a Flower strategy's round of training replies against the global model it sent."""

    def __init__(self, bounds: ReplyBounds) -> None:
        self.bounds = bounds
        #: what each client's sample count may count for, from the run's claims so far (checkpointed)
        self.weights = WeightBook(bounds.max_weight_ratio)

    def _screen(self, server_round: int, sent_arrays: Mapping[str, np.ndarray], targets: Iterable[Hashable],
                raws: Sequence[RawReply], batch: RoundReplies) -> RoundReplies:
        layout = ParamLayout.from_arrays(sent_arrays)
        sent = layout.flatten(list(sent_arrays.values()))

        def check(raw: RawReply) -> Reply:
            return Reply(raw.client_id, check_update(layout, raw.arrays, raw.names), check_num_examples(raw.num_examples), raw.metrics)

        screen(raws, {t: sent for t in targets}, check, model_change, self.bounds, batch, self.weights)
        for cid, reason in batch.rejections:
            log_rejected(cid, server_round, reason)
        return batch

    def messages(self, server_round: int, replies: Iterable[Message], sent_arrays: Mapping[str, np.ndarray],
                 outbox: Sequence[Message], failures: NodeFailures | None = None) -> tuple[list[Message], dict[str, float]]:
        """The Message-API replies that pass, and the round's reply counts as metrics (failed nodes are
        recorded in ``failures``, ``strategies.failures``)."""
        good, failed = split_replies(server_round, replies, outbox, failures)
        batch, raws, by_node = RoundReplies(failed=failed), [], {}
        for node, msg in good:
            try:
                raws.append(raw_reply(node, msg))
                by_node[node] = msg
            except UpdateRejected as err:
                batch.reject(node, str(err))
        self._screen(server_round, sent_arrays, [m.metadata.dst_node_id for m in outbox], raws, batch)
        read = {raw.client_id: raw for raw in raws}
        accepted = [_with_decoded(by_node[r.client_id], read[r.client_id]) for r in batch.accepted]  # type: ignore[index]
        return accepted, reply_counts(batch)

    def results(self, server_round: int, results: Sequence[tuple[Any, Any]], sent: Sequence[np.ndarray],
                failures: Sequence[Any]) -> tuple[list[tuple[Any, Any]], dict[str, float]]:
        """The legacy-API ``(proxy, FitRes)`` results that pass, and the round's reply counts as metrics."""
        batch, raws, by_cid = RoundReplies(failed=len(failures)), [], {}
        for proxy, res in results:
            try:
                arrays = decoded("parameters", lambda: parameters_to_ndarrays(res.parameters))  # noqa: B023
                raws.append(RawReply(proxy.cid, arrays, None, res.num_examples, dict(res.metrics)))
                by_cid[proxy.cid] = (proxy, res)
            except UpdateRejected as err:
                batch.reject(proxy.cid, str(err))
        self._screen(server_round, {str(i): a for i, a in enumerate(sent)}, [proxy.cid for proxy, _ in results], raws, batch)
        return [by_cid[r.client_id] for r in batch.accepted], reply_counts(batch)


def _with_decoded(msg: Message, raw: RawReply) -> Message:
    """``msg`` with its arrays as the checks read them (``DecodedArray``): the strategy does not decode them again."""
    record = next(iter(records(msg.content, ArrayRecord).values()))
    put_arrays(record, {name: DecodedArray.of(array, value) for (name, array), value in zip(record.items(), raw.arrays, strict=True)})
    return msg
