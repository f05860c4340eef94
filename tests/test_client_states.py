"""Each client's state between messages (``client_apps.client_states``): a node that hosts several clients
keeps each client's state in a file of its own and only their rounds in its ``Context``; a client's state
is as before the message until the client has answered, on a node of one client too."""

from __future__ import annotations

import json

import pytest
import torch
from flwr.app import ConfigRecord, Context, MessageType, RecordDict

from client_apps.client_states import ROUNDS, ClientStates
from client_apps.own_loop import RecordState
from flower_pfl.engine.client_algorithm import RESUMED_AFTER, RUN_KEY, SERVER_ROUND
from server_apps.inprocess import run_in_process

TRAIN, EVALUATE = MessageType.TRAIN, MessageType.EVALUATE


def _node(tmp_path, hosted: bool = True) -> tuple[Context, ClientStates]:
    node = Context(run_id=1, node_id=7, node_config={"partition-id": 0, "num-partitions": 2}, state=RecordDict(),
                   run_config={})
    return node, ClientStates(node, {"client-state-dir": str(tmp_path)}, checkpoint_every=0, hosted=hosted)


def _config(server_round: int, **more) -> dict:
    return {RUN_KEY: "run-x", SERVER_ROUND: server_round, **more}


def _train(states: ClientStates, client: int, server_round: int, value: float, keep: bool = True) -> Context:
    """``client`` trains in ``server_round``: its state ``c`` becomes ``value``; kept unless it failed."""
    config = _config(server_round)
    context = states.open(client, 10, config, TRAIN)
    RecordState(context.state)["c"] = [torch.full((3,), value)]
    if keep:
        states.keep(client, context, config, TRAIN)
    return context


def _value(states: ClientStates, client: int, server_round: int) -> float | None:
    state = RecordState(states.open(client, 10, _config(server_round), EVALUATE).state)
    return float(state["c"][0][0]) if "c" in state else None


def test_a_hosting_node_keeps_each_clients_state_in_its_own_file_and_only_rounds_in_its_context(tmp_path):
    node, states = _node(tmp_path)
    own = _train(states, 3, 1, 3.0)
    assert own.node_config["partition-id"] == 3 and own.node_config["num-partitions"] == 10
    _train(states, 4, 1, 4.0)
    _train(states, 4, 2, 40.0)
    assert list(node.state) == [ROUNDS] and dict(node.state[ROUNDS]) == {"3": 1, "4": 2}
    assert not node.state.array_records  # what travels with the node's messages: no client's arrays
    assert sorted(p.name for p in (tmp_path / "run-x" / "partition-4").iterdir()) == ["round-2.safetensors"]
    assert (_value(states, 3, 2), _value(states, 4, 2), _value(states, 5, 2)) == (3.0, 40.0, None)


def test_a_client_that_fails_keeps_its_state_from_before_the_message(tmp_path):
    for hosted in (True, False):
        node, states = _node(tmp_path / str(hosted), hosted)
        client = 3 if hosted else 0
        _train(states, client, 1, 1.0)
        failed = _train(states, client, 2, 2.0, keep=False)  # trained, then failed before it answered
        assert float(RecordState(failed.state)["c"][0][0]) == 2.0
        assert _value(states, client, 3) == 1.0, hosted
        _train(states, client, 3, 3.0)
        assert _value(states, client, 4) == 3.0, hosted


def test_a_node_of_one_client_keeps_its_state_in_its_context(tmp_path):
    node, states = _node(tmp_path, hosted=False)
    _train(states, 0, 1, 5.0)
    assert float(node.state.array_records["c"].to_numpy_ndarrays()[0][0]) == 5.0
    assert (tmp_path / "run-x" / "partition-0" / "round-1.safetensors").exists()  # for a resumed run


def test_a_missing_state_file_fails_the_client_naming_the_file_and_the_fix(tmp_path):
    node, states = _node(tmp_path)
    _train(states, 3, 1, 3.0)
    (tmp_path / "run-x" / "partition-3" / "round-1.safetensors").unlink()  # another machine of a Ray cluster
    with pytest.raises(FileNotFoundError, match=r"state of round 1 is not in .*partition-3.*every machine shares"):
        states.open(3, 10, _config(2), TRAIN)


def test_a_node_that_rejoins_takes_its_clients_state_back_and_a_resumed_one_the_checkpoints(tmp_path):
    node, states = _node(tmp_path)
    states.checkpoint_every = 2  # a checkpoint every second round: round 3's state is written after round 2's
    for r in (1, 2, 3):
        _train(states, 3, r, float(r))
    rejoined = ClientStates(Context(run_id=1, node_id=8, node_config={}, state=RecordDict(), run_config={}),
                            states.node_config, checkpoint_every=0, hosted=True)
    assert _value(rejoined, 3, 4) == 3.0  # a new Context: the latest file
    resumed = ClientStates(Context(run_id=2, node_id=9, node_config={}, state=RecordDict(), run_config={}),
                           states.node_config, checkpoint_every=0, hosted=True)
    context = resumed.open(3, 10, _config(3, **{RESUMED_AFTER: 2}), TRAIN)
    assert float(RecordState(context.state)["c"][0][0]) == 2.0  # the checkpoint of round 2 needs round 2's
    assert not (tmp_path / "run-x" / "partition-3" / "round-3.safetensors").exists()  # written after it: gone


def test_without_a_run_key_a_hosting_node_keeps_each_clients_records_apart_in_its_context(tmp_path):
    node, states = _node(tmp_path)
    for client, value in [(3, 3.0), (4, 4.0)]:
        context = states.open(client, 10, {SERVER_ROUND: 1}, TRAIN)
        context.state["c"] = ConfigRecord({"v": value})
        states.keep(client, context, {SERVER_ROUND: 1}, TRAIN)
    assert sorted(node.state) == ["c3/c", "c4/c"]
    assert states.open(4, 10, {}, EVALUATE).state["c"]["v"] == 4.0


SMALL = {"method": "scaffold", "num-rounds": 3, "clients-per-round": 6, "local-steps": 5, "eval-every": 1, "seed": 3}


def _run(tmp_path, name: str, **overrides) -> dict:
    out = run_in_process({**SMALL, **overrides, "output-dir": str(tmp_path / name)}, num_clients=8)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {"accuracy": [r["accuracy"] for r in rows if r["phase"] == "evaluate"],
            "summary": json.loads((out / "summary.json").read_text())}


def test_clients_that_fail_together_after_training_start_again_from_their_state_before_the_round(tmp_path, monkeypatch):
    """SCAFFOLD's clients keep c_i: a node whose round failed as one computation after its clients had
    updated it trains them again one by one, from c_i as it was, to the numbers of a run trained one by one."""
    import client_apps.app as capp

    one_by_one = _run(tmp_path, "apart", **{"batch-clients": False})
    together = capp.train_round

    def fails_after_training(contents, contexts):
        together(contents, contexts)  # every client's state updated ...
        raise RuntimeError("device lost")  # ... and no reply

    monkeypatch.setattr(capp, "train_round", fails_after_training)
    retried = _run(tmp_path, "retried")
    assert retried["accuracy"] == one_by_one["accuracy"]
    assert retried["summary"]["clients_trained_one_by_one"] == 3 * 6
    (why,) = retried["summary"]["one_by_one_because"]
    assert "failed as one computation" in why and "device lost" in why and "from its state before" in why


def test_a_client_that_fails_after_training_counts_as_one_that_failed_before(tmp_path, monkeypatch):
    """The server discards a failed client's update; the client's state is as before the round, as if it had
    failed before it started."""
    import client_apps.app as capp

    fit, start_fit = capp.Node.fit, capp.Node.start_fit
    fails = {}

    def fit_then_fail(self, config):
        out = fit(self, config)  # c_i updated ...
        if fails.get("after") == (self.partition_id, int(config[SERVER_ROUND])):
            raise RuntimeError("reply lost")  # ... and no reply
        return out

    def fail_first(self, config, *args):
        if fails.get("before") == (self.partition_id, int(config[SERVER_ROUND])):
            raise RuntimeError("reply lost")
        return start_fit(self, config, *args)

    monkeypatch.setattr(capp.Node, "fit", fit_then_fail)
    monkeypatch.setattr(capp.Node, "start_fit", fail_first)
    clean = _run(tmp_path, "clean", **{"batch-clients": False})
    fails["before"] = (2, 2)
    before = _run(tmp_path, "before", **{"batch-clients": False})
    fails.clear()
    fails["after"] = (2, 2)
    after = _run(tmp_path, "after", **{"batch-clients": False})
    assert after["accuracy"] == before["accuracy"] != clean["accuracy"]
    assert after["summary"]["status"] == before["summary"]["status"]
