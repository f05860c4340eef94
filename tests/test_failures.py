"""Failing and lost nodes (``strategies.failures``): the cause named, one console line per node and cause,
a node that keeps failing declared lost once and no longer sampled, and a run that stops when the nodes
left cannot make a round that counts, with a reason that names the loss."""

from __future__ import annotations

import json
import logging
import re

import fabricate as fb
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message
from flwr.common import Error

from flower_pfl.run.quiet import DivertRecords
from flower_pfl.run.results import Coverage, RunFailed, RunRecorder
from server_apps.inprocess import run_in_process
from server_apps.recording import _Schedule
from strategies.failures import NO_REPLY, NodeFailures, failure_cause
from strategies.legacy import record_failures
from strategies.nodes import NodeWatch, split_replies

SMALL = {"num-rounds": 6, "clients-per-round": 4, "local-steps": 5, "eval-every": 2, "seed": 1}
RAY_DIED = ("<class 'ray.exceptions.ActorDiedError'>:<'The actor died unexpectedly before finishing this task.\n"
            "\tclass_name: ClientAppActor\n\tactor_id: 5f2b'>")


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_the_cause_is_the_errors_name():
    assert failure_cause(RAY_DIED) == "ActorDiedError"
    wrapped = ("<class 'flwr.clientapp.client_app.ClientAppException'>:<'\nException ClientAppException occurred. "
               "Message: ValueError: No query function registered with name 'default''>")
    assert failure_cause(wrapped) == "ValueError"  # Flower's wrapper is not the cause
    assert failure_cause("RuntimeError('device lost')") == "RuntimeError"  # an in-process grid's reply
    assert failure_cause("Error: Node Unavailable — The destination node failed to report a heartbeat") == "Node Unavailable"
    assert failure_cause("Error: Message Unavailable - The requested message could not be found") == "Message Unavailable"
    assert failure_cause("client crashed") == "client crashed"  # nothing better: the reason's first line


def test_one_line_per_node_and_cause_and_the_lost_node_named_once(caplog, tmp_path):
    failures = NodeFailures(lost_after=3, log_file=tmp_path / "failures.log")
    for rnd in range(1, 8):
        failures.record(rnd, 7, RAY_DIED, phase="train")
        failures.record(rnd, 7, RAY_DIED, phase="evaluate")  # a second failure in the same round
        failures.record(rnd, 9, NO_REPLY)
        failures.end_round(rnd)
    lines = _lines(caplog)
    assert [line for line in lines if "node 7 failed" in line] == [
        f"round 1: node 7 failed (ActorDiedError: The actor died unexpectedly before finishing this task.); its stored "
        f"model is unchanged (repeats are counted; full reasons in {tmp_path / 'failures.log'})"]
    assert len([line for line in lines if "node 9 sent no reply" in line]) == 1
    lost = [line for line in lines if " lost: " in line]
    assert lost == [
        "round 3: node 7 lost: it failed in the last 3 rounds it was sent work, since round 1 (ActorDiedError); "
        "not sampled from now on (lost-node-rounds = 3)",
        "round 3: node 9 lost: it failed in the last 3 rounds it was sent work, since round 1 (no reply); "
        "not sampled from now on (lost-node-rounds = 3)"]
    log = (tmp_path / "failures.log").read_text()
    entries = re.findall(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d round (\d+) node (\d+)", log, re.MULTILINE)
    assert len(entries) == 7 * 2 + 7 and log.count("actor_id: 5f2b") == 14  # every failure, in full
    assert failures.report() == ["ActorDiedError: 14 failures of node 7 since round 1, lost",
                                 "no reply: 7 failures of node 9 since round 1, lost"]
    summary = failures.summary()
    assert summary["lost_nodes"] == {"7": {"cause": "ActorDiedError", "since": 1}, "9": {"cause": "no reply", "since": 1}}
    assert (summary["failed_nodes"], summary["client_failures"]) == (2, 21)


def test_an_answer_ends_the_streak_and_zero_never_declares_a_node_lost():
    failures = NodeFailures(lost_after=3)
    for rnd, fails in enumerate([True, True, False, True, True], start=1):
        failures.record(rnd, 4, "boom") if fails else failures.answered(4)
        failures.end_round(rnd)
    assert failures.lost == {} and failures.streaks[4].rounds == 2 and failures.streaks[4].since == 4
    never = NodeFailures(lost_after=0)
    for rnd in range(1, 20):
        never.record(rnd, 4, "boom")
        never.end_round(rnd)
    assert never.lost == {} and never.history[4].total == 19
    with pytest.raises(ValueError, match="lost_after must be an integer >= 0"):
        NodeFailures(lost_after=-1)


def test_lost_nodes_are_neither_sampled_nor_waited_for():
    watch = NodeWatch(timeout=30.0, lost_after=2)
    grid = fb.FakeGrid([1, 2, 3, 4])
    assert watch.wait(grid, 4) == [1, 2, 3, 4]
    fb.set_task_identity()
    for rnd in (1, 2):
        sent = [Message(fb.RecordDict({"config": ConfigRecord()}), message_type="train", dst_node_id=n) for n in (1, 2, 3, 4)]
        for i, msg in enumerate(sent):
            msg.metadata.__dict__["_message_id"] = f"{rnd}-{i}"
        replies = [Message(Error(code=0, reason=RAY_DIED), reply_to=m) if m.metadata.dst_node_id == 3
                   else fb.eval_reply(m, 0.5, 10) for m in sent]
        good, failed = split_replies(rnd, replies, sent, watch.failures)
        assert failed == 1 and [n for n, _ in good] == [1, 2, 4]
    assert list(watch.failures.lost) == [3]
    assert watch.wait(grid, 4) == [1, 2, 4]  # at once: the lost node is not waited for


def test_a_message_strategy_stops_sending_to_a_lost_node():
    fb.set_task_identity()
    import strategies.message

    strategy = strategies.message.FedMCSA(clients_per_round=3, min_available_nodes=3, lost_node_rounds=2,
                                          fraction_evaluate=0.0)
    arrays = ArrayRecord({k: Array(v) for k, v in fb.model_arrays(0.0).items()})
    grid = fb.FakeGrid([11, 12, 13], answers={n: {"partition-id": i} for i, n in enumerate([11, 12, 13])})
    for rnd in (1, 2):
        sent = list(strategy.configure_train(rnd, arrays, ConfigRecord({}), grid))
        assert sorted(m.metadata.dst_node_id for m in sent) == [11, 12, 13]
        replies = [Message(Error(code=0, reason="RuntimeError('disk full')"), reply_to=m) if m.metadata.dst_node_id == 12
                   else fb.train_reply(m, fb.model_arrays(1.0)) for m in sent]
        _, metrics = strategy.aggregate_train(rnd, replies)
        assert (metrics["clients-accepted"], metrics["clients-failed"]) == (2, 1)
    sent = list(strategy.configure_train(3, arrays, ConfigRecord({}), grid))
    assert sorted(m.metadata.dst_node_id for m in sent) == [11, 13]


def _schedule(tmp_path, lost: int, clients: int = 12, first: str = RAY_DIED, hosts: dict[int, int] | None = None) -> _Schedule:
    """``lost`` nodes lost: node 0 by ``first``, the others by a dead Ray actor (with ``hosts``, the ids are
    clients, each hosted by the node ``hosts`` names)."""
    recorder = RunRecorder(tmp_path, {}, 10, log=lambda _: None, coverage=Coverage(clients=clients, share=0.8))
    failures = NodeFailures(lost_after=1)
    if hosts:
        failures.noun, failures.hosts = "client", hosts
    for node in range(lost):
        failures.record(2 + node % 2, node, RAY_DIED if node else first)
    failures.end_round(3)
    return _Schedule(recorder, 5, None, 0, failures=failures)


def test_the_run_stops_when_the_nodes_left_cannot_make_a_round_that_counts(tmp_path):
    _schedule(tmp_path / "a", lost=2).check_losses(4)  # 10 of 12 left: enough, the run goes on
    with pytest.raises(RunFailed) as stopped:
        _schedule(tmp_path / "b", lost=3).check_losses(4)
    message = str(stopped.value)
    # a simulation's nodes stay: what is gone is the Ray worker that ran their actors
    assert message.startswith("round 4: the Ray worker behind the actors of 3 of the federation's 12 nodes is gone since "
                              "round 2 (ActorDiedError): the actors died with it and are not replaced during a run, so "
                              "every message to those nodes fails, and the 9 nodes left cannot make an evaluated round that "
                              "counts (min-evaluated-share 0.8 asks for 10). Ray's logs say why the worker died")
    assert "nodes lost" not in message and "client-resources-num-cpus" in message
    assert f"resume-from = '{tmp_path / 'b'}'" in message and "learning rate" not in message
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"] in message


def test_clients_lost_with_their_node_are_counted_as_clients_and_their_node_as_a_node(tmp_path):
    """24 clients on 4 nodes, the Ray worker of the node hosting clients 0-5 gone: one node, six clients."""
    with pytest.raises(RunFailed) as stopped:
        _schedule(tmp_path, lost=6, clients=24, hosts={c: 100 + c // 6 for c in range(24)}).check_losses(4)
    message = str(stopped.value)
    assert message.startswith("round 4: the Ray worker behind the actors of 1 of the federation's 4 nodes, hosting 6 of "
                              "its 24 clients, is gone since round 2 (ActorDiedError)"), message
    assert "every message to that node fails, and the 18 clients left cannot make an evaluated round" in message


def test_nodes_lost_for_other_causes_too_are_named_as_lost_nodes(tmp_path):
    """Where a lost node failed with an error of its own, the run cannot blame a Ray worker alone."""
    with pytest.raises(RunFailed) as stopped:
        _schedule(tmp_path, lost=3, first="RuntimeError('disk full')").check_losses(4)
    message = str(stopped.value)
    assert message.startswith("round 4: 3 of the federation's 12 nodes lost since round 2 (ActorDiedError, RuntimeError): "
                              "the 9 nodes left cannot make an evaluated round that counts")
    assert "Ray worker behind" not in message and "A lost SuperNode is not replaced during a run" in message


def test_in_process_a_client_that_always_fails_is_lost_and_the_run_goes_on_or_stops(tmp_path, monkeypatch):
    """Partition 0's node fails whatever it is sent (a machine gone). With min-evaluated-share 0.5 it is lost
    after two rounds and the rounds after them train and evaluate the other three; with the default 0.8 the
    run stops, naming the loss."""
    import client_apps.app as capp

    fit, evaluate = capp.Node.start_fit, capp.Node.evaluate

    def flaky_fit(self, config, *args):
        if self.partition_id == 0:
            raise RuntimeError("device lost")
        return fit(self, config, *args)

    def flaky_evaluate(self, *args, **kwargs):
        if self.partition_id == 0:
            raise RuntimeError("device lost")
        return evaluate(self, *args, **kwargs)

    monkeypatch.setattr(capp.Node, "start_fit", flaky_fit)
    monkeypatch.setattr(capp.Node, "evaluate", flaky_evaluate)
    settings = {**SMALL, "lost-node-rounds": 2, "batch-clients": False}
    out = run_in_process({**settings, "min-evaluated-share": 0.5, "output-dir": str(tmp_path / "on")}, num_clients=4)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [(r["clients-accepted"], r["clients-failed"]) for r in rows if r["phase"] == "train"]
    assert train == [(3, 1), (3, 1), (3, 0), (3, 0), (3, 0), (3, 0)]
    assert [r["clients-evaluated"] for r in rows if r["phase"] == "evaluate"] == [3, 3, 3, 3]  # rounds 1, 2, 4, 6
    summary = json.loads((out / "summary.json").read_text())
    (lost,) = summary["lost_nodes"].values()
    assert lost == {"cause": "RuntimeError", "since": 1} and summary["client_failures"] == 3  # 2 trainings, 1 evaluation
    assert summary["status"] == "completed" and summary["failures_log"] == str(out / "failures.log")
    assert (out / "failures.log").read_text().count("device lost") == 3

    with pytest.raises(RunFailed, match=r"round 2: 1 of the federation's 4 clients lost since round 1 \(RuntimeError\)"):
        run_in_process({**settings, "output-dir": str(tmp_path / "off")}, num_clients=4)
    (stopped,) = list((tmp_path / "off").iterdir())
    assert json.loads((stopped / "summary.json").read_text())["lost_nodes"]


def test_a_simulations_per_message_tracebacks_go_to_a_file(tmp_path):
    logger = logging.getLogger("test-divert")
    divert = DivertRecords([(__file__, "_engine_worker")])
    logger.addFilter(divert)
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    logger.addHandler(handler)
    try:
        def _engine_worker() -> None:
            logger.error("Traceback (most recent call last): ... ActorDiedError")
            logger.warning("a warning stays")

        _engine_worker()
        logger.error("an error of the engine itself stays")
        assert divert.held and divert.count == 1
        divert.write_to(tmp_path / "failures.log")
        _engine_worker()
    finally:
        logger.removeFilter(divert)
        logger.removeHandler(handler)
    assert seen == ["a warning stays", "an error of the engine itself stays", "a warning stays"]
    assert (tmp_path / "failures.log").read_text().count("ActorDiedError") == 2 and not divert.held
    assert divert.count == 2


def test_a_run_whose_clients_all_fail_says_they_failed_not_that_the_learning_rate_diverged(tmp_path):
    recorder = RunRecorder(tmp_path, {}, 10, log=lambda _: None)
    failures = NodeFailures(lost_after=0)
    schedule = _Schedule(recorder, 5, None, 0, max_idle_rounds=0.1, failures=failures)
    failed = {"clients-accepted": 0, "clients-rejected": 0, "clients-failed": 2}
    for rnd in (1, 2):
        for node in (1, 2):
            failures.record(rnd, node, "RuntimeError('device lost')")
        if rnd == 1:
            schedule.after_train(rnd, failed)
    with pytest.raises(RunFailed) as stopped:
        schedule.after_train(2, failed)
    assert "their clients failed (RuntimeError: 4 failures of 2 nodes [1, 2] since round 1; full reasons in" in str(stopped.value)
    assert "learning rate" not in str(stopped.value)
    refused = _Schedule(RunRecorder(tmp_path / "r", {}, 10, log=lambda _: None), 5, None, 0, max_idle_rounds=0.1,
                        failures=NodeFailures())
    refused.after_train(1, {"clients-accepted": 0, "clients-rejected": 2, "clients-failed": 0})
    with pytest.raises(RunFailed, match="every update failed or was refused .* learning rate"):
        refused.after_train(2, {"clients-accepted": 0, "clients-rejected": 2, "clients-failed": 0})


def test_a_legacy_failure_that_names_no_client_is_counted_with_its_inner_cause_and_never_lost(caplog):
    """Flower's legacy loop passes some failures as bare exceptions, wrapping the client's error."""
    failures = NodeFailures(lost_after=1)
    error = ValueError("Message contains an Error (reason: RuntimeError('device lost')). It originated during "
                       "client-side execution of a message.")
    for rnd in (1, 2, 3):
        record_failures(failures, rnd, [error], "train")
        failures.end_round(rnd)
    assert failures.lost == {}  # it may be any client: nothing is excluded
    (line,) = [m for m in _lines(caplog) if "failed" in m]
    assert line.startswith("round 1: a client (the legacy API does not say which) failed (RuntimeError: ")
    assert failures.report() == ["RuntimeError: 3 failures of clients the legacy API did not name since round 1"]
