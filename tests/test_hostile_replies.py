"""No single client can crash a run or change what the server stores by sending something malformed.

Every method is driven through both APIs with real client algorithms (``test_twins.Clients``): one
honest round, then a round in which one client's reply is hostile (the first round, for the extras
of a method whose clients send them only then). The round must go on, the
hostile reply must be refused with a logged reason naming the client and the field, and the
server must end exactly where it ends when that client simply fails.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import fabricate as fb
import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common import Code, FitRes, Parameters, Status, ndarrays_to_parameters, parameters_to_ndarrays
from test_twins import NODES, OURS, TRAINING, Clients, _assert_same_state, _twins

#: stands in a ``Case.field`` for the name of the extra the hostile change touched (SCAFFOLD's
#: ``delta-c``, FedAttn's representation or bias gradient): the refusal must name one of them
EXTRA = "<the extra's name>"


@dataclass(frozen=True)
class Case:
    """A hostile change to an honest reply: to its arrays (by name), sample count, extras; ``field``
    is what the refusal must say (every text of it)."""

    name: str
    field: str | tuple[str, ...]
    arrays: Callable[[dict[str, np.ndarray]], dict[str, Any]] = lambda a: a
    num_examples: Callable[[int], Any] = lambda n: n
    extras: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    message_only: bool = False
    legacy_only: bool = False


def _first(arrays: dict[str, np.ndarray], value: Any) -> dict[str, Any]:
    out = dict(arrays)
    name = next(iter(out))
    out[name] = value(out[name])
    return out


def _every_extra(value: Callable[[Any], Any]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda extras: {k: value(v) for k, v in extras.items()}


CASES = [
    Case("num-examples-list", "num-examples", num_examples=lambda n: [n, n]),
    Case("num-examples-zero", "num-examples", num_examples=lambda n: 0),
    Case("num-examples-negative", "num-examples", num_examples=lambda n: -10),
    Case("num-examples-nan", "num-examples", num_examples=lambda n: math.nan),
    Case("num-examples-inf", "num-examples", num_examples=lambda n: math.inf),
    Case("num-examples-string", "num-examples", num_examples=lambda n: "10", legacy_only=True),
    Case("num-examples-bool", "num-examples", num_examples=lambda n: True, legacy_only=True),
    Case("array-bytes-short", "cannot be decoded", message_only=True,
         arrays=lambda a: _first(a, lambda x: "truncate")),
    Case("parameters-garbage", "cannot be decoded", legacy_only=True, arrays=lambda a: _first(a, lambda x: "garbage")),
    Case("array-nan", "NaN", arrays=lambda a: _first(a, lambda x: np.full_like(x, np.nan))),
    Case("array-inf", "Inf", arrays=lambda a: _first(a, lambda x: np.full_like(x, -np.inf))),
    Case("array-huge", "max-update-ratio", arrays=lambda a: {k: np.full_like(v, 1e38 if v.dtype.kind == "f" else 2**20) for k, v in a.items()}),
    Case("array-large", "max-update-ratio", arrays=lambda a: {k: (v + 1e3).astype(v.dtype) for k, v in a.items()}),
    Case("array-float64", "dtype", arrays=lambda a: _first(a, lambda x: x.astype(np.float64))),
    Case("array-shape", "shape", arrays=lambda a: _first(a, lambda x: x.reshape(-1))),
    Case("array-missing", "arrays", arrays=lambda a: dict(list(a.items())[:-1])),
    Case("array-extra", "arrays", arrays=lambda a: {**a, "z.extra": np.zeros(1, np.float32)}),
    Case("array-renamed", "names", message_only=True, arrays=lambda a: {f"x{k}": v for k, v in a.items()}),
    Case("extras-short", ("values", EXTRA), extras=_every_extra(lambda v: v[:4])),
    Case("extras-not-bytes", ("as bytes, got float", EXTRA), extras=_every_extra(lambda v: 3.0), legacy_only=True),
    Case("extras-missing", ("lacks", EXTRA), extras=lambda e: {}),
    Case("extras-nan", ("NaN", EXTRA), extras=_every_extra(lambda v: np.full(len(v) // 4, np.nan, "<f4").tobytes())),
    # free vectors are bounded by the round's median; structured ones (IFCA's one-hot choice, FedProto's
    # class shares, FedCAC's 0/1 mask) are refused by their own check first
    Case("extras-huge", ("max-median-ratio | not a one-hot vector | class shares | not a 0/1 mask", EXTRA),
         extras=_every_extra(lambda v: np.full(len(v) // 4, 1e30, "<f4").tobytes())),
]


#: methods whose clients send their extras only until the server has what it needs from them (FedDBE's
#: running means make its consensus in round 1): their extras cases are played in the first round
EXTRAS_UNTIL_KNOWN = {"feddbe"}


def _case_params(api: str) -> list[Any]:
    out = []
    for entry in OURS:
        for case in CASES:
            if (api == "legacy" and case.message_only) or (api == "message" and case.legacy_only):
                continue
            if case.extras is not None and not entry.declaration.client.reply_keys:
                continue  # the extras cases: the methods whose clients send more than a model
            out.append(pytest.param(entry, case, id=f"{entry.label}-{case.name}"))
    return out


def _message_array(name: str, value: Any, like: np.ndarray) -> Array:
    if isinstance(value, str):  # bytes that do not match the header's shape and dtype
        honest = Array(like)
        return Array(dtype=honest.dtype, shape=tuple(honest.shape), stype=honest.stype, data=honest.data[:10])
    return Array(np.asarray(value))


def _message_reply(msg: Message, arrays: dict[str, Any], honest: dict[str, np.ndarray], n: Any, extras: dict | None) -> Message:
    content = RecordDict({
        "arrays": ArrayRecord({k: _message_array(k, v, honest.get(k, np.zeros(1, np.float32))) for k, v in arrays.items()}),
        "metrics": MetricRecord({"num-examples": n, "train-loss": 0.5}),
    })
    if extras:
        content["payload"] = ConfigRecord(extras)
    return Message(content, reply_to=msg)


def _legacy_res(arrays: dict[str, Any], n: Any, extras: dict | None) -> FitRes:
    if any(isinstance(v, str) for v in arrays.values()):
        params = Parameters(tensors=[b"garbage"] * len(arrays), tensor_type="numpy.ndarray")
    else:
        params = ndarrays_to_parameters(list(arrays.values()))
    res = FitRes(Status(Code.OK, ""), params, 10, {"train-loss": 0.5, **(extras or {})})
    res.num_examples = n
    return res


def _round(strategy: Any, api: str, rnd: int, state: dict, clients: Clients, hostile: Case | None, fail: bool) -> dict:
    """One training round of ``strategy``; the first participant's reply is changed by ``hostile`` (or it fails)."""
    names = state["names"]
    if api == "message":
        msgs = list(strategy.configure_train(rnd, state["arrays"], ConfigRecord(dict(TRAINING)), fb.FakeGrid(NODES)))
        replies = []
        state["hostile"] = msgs[0].metadata.dst_node_id  # the round's first participant
        for msg in msgs:
            node = msg.metadata.dst_node_id
            trained, n, extras = clients.train(node, [a.numpy() for a in msg.content["arrays"].values()], dict(msg.content["config"]))
            honest, state["extras"] = dict(zip(names, trained)), sorted(extras)
            if node == state["hostile"] and fail:
                replies.append(fb.error_reply(msg))
            elif node == state["hostile"] and hostile is not None:
                bad_extras = hostile.extras(dict(extras)) if hostile.extras is not None else extras
                replies.append(_message_reply(msg, hostile.arrays(honest), honest, hostile.num_examples(n), bad_extras))
            else:
                replies.append(fb.train_reply(msg, honest, n, extras=extras or None))
        arrays, metrics = strategy.aggregate_train(rnd, replies)
        if arrays is not None:
            state["arrays"] = arrays
        return dict(metrics)
    fit = strategy.configure_fit(rnd, state["params"], state["cm"])
    results, failures = [], []
    state["hostile"] = int(fit[0][0].cid)
    for proxy, ins in fit:
        node = int(proxy.cid)
        trained, n, extras = clients.train(node, parameters_to_ndarrays(ins.parameters), dict(ins.config))
        honest, state["extras"] = dict(zip(names, trained)), sorted(extras)
        if node == state["hostile"] and fail:
            failures.append(RuntimeError("client crashed"))
        elif node == state["hostile"] and hostile is not None:
            bad_extras = hostile.extras(dict(extras)) if hostile.extras is not None else extras
            results.append((proxy, _legacy_res(hostile.arrays(honest), hostile.num_examples(n), bad_extras)))
        else:
            results.append((proxy, fb.fit_res(trained, n, extras)))
    params, metrics = strategy.aggregate_fit(rnd, results, failures)
    if params is not None:
        state["params"] = params
    return dict(metrics)


def _client_manager() -> Any:
    return fb.client_manager([str(n) for n in NODES])


def _start(entry: Any, api: str, honest_rounds: int = 1) -> tuple[Any, dict, Clients]:
    """A strategy after ``honest_rounds`` honest rounds (after one, every method has state), with its clients."""
    fb.set_task_identity()
    legacy, message, initial = _twins(entry)
    strategy = message if api == "message" else legacy
    state = {"names": list(initial), "arrays": ArrayRecord({k: torch.as_tensor(v) for k, v in initial.items()}),
             "params": legacy.initial_parameters, "cm": _client_manager()}
    clients = Clients()
    for rnd in range(1, honest_rounds + 1):
        _round(strategy, api, rnd, state, clients, None, fail=False)
    return strategy, state, clients


def _copy(server: tuple[Any, dict, Clients]) -> tuple[Any, dict, Clients]:
    """An independent copy of a server, its round state and its clients (with client proxies of its own)."""
    strategy, state, clients = server
    twin = copy.deepcopy((strategy, {k: v for k, v in state.items() if k != "cm"}, clients))
    return twin[0], {**twin[1], "cm": _client_manager()}, twin[2]


@functools.cache
def _honest_then_failed(label: str, api: str, honest_rounds: int) -> tuple[tuple[Any, dict, Clients], tuple[Any, dict, Clients], dict]:
    """``_start``'s server, and a copy of it after a round in which the first participant failed, with that round's
    metrics: every hostile case of a method and API starts from a copy of the first and must end like the second."""
    (entry,) = [e for e in OURS if e.label == label]
    start = _start(entry, api, honest_rounds)
    failed = _copy(start)
    metrics = _round(failed[0], api, honest_rounds + 1, failed[1], failed[2], None, fail=True)
    return start, failed, metrics


def _check_refused_like_a_failure(entry: Any, case: Case, api: str, caplog: pytest.LogCaptureFixture) -> None:
    honest = 0 if case.extras is not None and entry.method in EXTRAS_UNTIL_KNOWN else 1
    start, failed, expected = _honest_then_failed(entry.label, api, honest)  # the same seed and clients: the same server so far
    twin = _copy(failed)  # reading a server's state may complete it (pFedLA widens its hypernetworks as it reads them)
    fb.set_task_identity()
    strategy, state, clients = _copy(start)
    caplog.clear()
    metrics = _round(strategy, api, honest + 1, state, clients, case, fail=False)
    assert metrics["clients-rejected"] == 1 and metrics["clients-accepted"] == expected["clients-accepted"] > 0
    refusals = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
    assert len(refusals) == 1 and f"client {state['hostile']} " in refusals[0], refusals
    for text in (case.field,) if isinstance(case.field, str) else case.field:
        named = [f"'{key}'" for key in state["extras"]] if text == EXTRA else text.split(" | ")  # alternatives
        assert named and any(name in refusals[0] for name in named), (text, named, refusals[0])
    _assert_same_state(strategy, twin[0])  # the refused reply changed nothing: as if the client had failed
    if api == "message":
        for k, v in state["arrays"].items():
            np.testing.assert_array_equal(v.numpy(), twin[1]["arrays"][k].numpy())


@pytest.mark.parametrize("entry,case", _case_params("message"))
def test_message_api_refuses_a_hostile_reply_as_if_the_client_had_failed(entry, case, caplog):
    _check_refused_like_a_failure(entry, case, "message", caplog)


@pytest.mark.parametrize("entry,case", _case_params("legacy"))
def test_legacy_api_refuses_a_hostile_reply_as_if_the_client_had_failed(entry, case, caplog):
    _check_refused_like_a_failure(entry, case, "legacy", caplog)


# --- a node's pack: the reply of a node that hosts several clients -------------------------------------------------

from flwr.app import MessageType  # noqa: E402

from client_apps.flower_internals import TaskIdentity  # noqa: E402
from server_apps.client_grid import ClientGrid  # noqa: E402
from server_apps.node_order import query_nodes  # noqa: E402
from strategies.client_packs import ERRORS, PACK, REPORT, Tally, pack  # noqa: E402


def _set(record_key: str, key: str, value: Any) -> Callable[[RecordDict], None]:
    def change(content: RecordDict) -> None:
        content[record_key][key] = value
    return change


def _replace(record_key: str, record: Any) -> Callable[[RecordDict], None]:
    def change(content: RecordDict) -> None:
        content[record_key] = record
    return change


def _drop_record(content: RecordDict) -> None:
    del content[next(k for k in content if k not in (PACK, ERRORS, REPORT))]


#: hostile changes to a node's reply pack (its records, its table of contents, its account of the round)
PACK_CASES = {
    "report-count-not-a-number": _set(REPORT, "together", "many"),
    "report-count-negative": _set(REPORT, "one-by-one", -3),
    "report-count-inflated": _set(REPORT, "together", 10**9),
    "report-reasons-without-counts": _set(REPORT, "counts", [1, 2]),
    "report-reason-count-inflated": _replace(REPORT, ConfigRecord({"together": 0, "one-by-one": 1, "reasons": ["x"],
                                                                   "counts": [50]})),
    "report-not-a-config-record": _replace(REPORT, MetricRecord({"together": 1})),
    "table-clients-not-ids": _set(PACK, "clients", ["3"]),
    "table-record-place-not-a-number": _set(PACK, "3.records", ["x"]),
    "table-record-missing": _drop_record,
    "table-not-a-config-record": _replace(PACK, MetricRecord({"clients": 1})),
    "errors-not-client-ids": _replace(ERRORS, ConfigRecord({"three": "ValueError('x')"})),
}


class _Nodes:
    """Two nodes, 50 hosting clients 0-2 and 60 hosting 3-4; each answers a pack (each client's value doubled,
    with an honest account), node 60's changed by ``change``; a query's answer is each client's partition id."""

    def __init__(self, change: Callable[[RecordDict], None]) -> None:
        self.change = change

    def get_node_ids(self) -> list[int]:
        return [50, 60]

    def send_and_receive(self, messages, *, timeout=None):
        from strategies.client_packs import unpack

        replies = []
        for msg in messages:
            node = msg.metadata.dst_node_id
            if msg.metadata.message_type == MessageType.QUERY:
                asked = {50: [0, 1, 2], 60: [3, 4]}[node]
                content = pack({c: RecordDict({"metrics": MetricRecord({"partition-id": c})}) for c in asked})
            else:
                contents, _ = unpack(msg.content)
                content = pack({c: RecordDict({"metrics": MetricRecord({"value": 2 * float(x["config"]["v"])})})
                                for c, x in contents.items()}, report=Tally(together=len(contents)).record())
            if node == 60:
                self.change(content)
            replies.append(Message(content, reply_to=msg))
        return replies


@pytest.mark.parametrize("case", list(PACK_CASES))
def test_a_nodes_malformed_pack_costs_its_clients_never_the_run(case):
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    grid = ClientGrid(_Nodes(PACK_CASES[case]), {0: 50, 1: 50, 2: 50, 3: 60, 4: 60})
    sent = [Message(RecordDict({"config": ConfigRecord({"v": float(c)})}), dst_node_id=c, message_type=MessageType.TRAIN)
            for c in (0, 2, 3, 4)]
    replies = {m.metadata.src_node_id: m for m in grid.send_and_receive(sent)}
    assert {c: m.content["metrics"]["value"] for c, m in replies.items() if not m.has_error()} == {0: 0.0, 2: 4.0}
    for client in (3, 4):
        assert replies[client].error.reason.startswith("node 60 (hosting clients 3, 4) sent a malformed reply: malformed")
    assert grid.training_report()["clients_trained_together"] == 2  # the bad node's account is not taken


@pytest.mark.parametrize("case", [c for c in PACK_CASES if c.startswith(("table", "errors"))])
def test_a_nodes_malformed_start_up_answer_is_named_and_the_others_count(case, caplog):
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    info = query_nodes(_Nodes(PACK_CASES[case]))
    assert sorted(info) == [0, 1, 2] and {about["node"] for about in info.values()} == {50}
    assert any("node 60 failed to answer the start-up query: a malformed answer (malformed" in r.getMessage()
               for r in caplog.records)
