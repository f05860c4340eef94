"""Nodes that name the clients they host (a deployment's node config ``partition-ids`` and ``num-partitions``),
in process: the federation they describe is checked before the first round, and a node that connects late,
or comes back with a new node id, brings its clients (and their state) with it."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from flwr.app import MessageType

from client_apps.app import app as client_app
from flower_pfl.experiment.config import ConfigError, ExperimentConfig
from server_apps.app import run_experiment
from server_apps.inprocess import InProcessGrid, in_process_grid

SMALL = {"method": "scaffold", "num-rounds": 4, "clients-per-round": 4, "local-steps": 3, "eval-every": 1, "seed": 2}


def _hosting(*ranges: str, total: int = 10) -> list[dict[str, Any]]:
    return [{"partition-ids": ids, "num-partitions": total} for ids in ranges]


def _config(tmp_path, **overrides) -> dict[str, Any]:
    return {**ExperimentConfig().to_run_config(), **SMALL, "output-dir": str(tmp_path), **overrides}


def _run(grid: InProcessGrid, run_config: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    out = run_experiment(grid, run_config)  # type: ignore[arg-type]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return json.loads((out / "summary.json").read_text()), [r for r in rows if r["phase"] == "evaluate"]


@pytest.mark.parametrize("configs,overrides,message", [
    (_hosting("0-4", "5..9"), {}, r"node 1002: node config partition-ids = '5..9': '5..9' is not a client id"),
    (_hosting("0-4", "5-1000000000"), {}, r"names clients up to 1000000000, outside the federation's 10"),
    (_hosting("0-4", "5-9") + _hosting("10-11", total=12), {}, r"disagree on the federation's number of clients "
                                                               r"\(num-partitions: nodes 1001, 1002: 10; node 1003: 12\)"),
    (_hosting("0-4", "5-9"), {"num-clients": 8}, r"run config num-clients = 8, but this node's num-partitions = 10"),
    ([{"partition-ids": "0-4", "num-partitions": "ten"}, *_hosting("5-9")], {}, r"num-partitions = 'ten': a whole number"),
])
def test_a_federation_its_nodes_do_not_describe_is_refused_before_the_first_round(tmp_path, configs, overrides, message):
    grid = in_process_grid(client_app, len(configs), _config(tmp_path, **overrides), node_configs=configs)
    with pytest.raises(ConfigError, match=message):
        run_experiment(grid, _config(tmp_path, **overrides))  # type: ignore[arg-type]
    assert not list(tmp_path.iterdir())  # refused before the results folder


def test_clients_no_node_hosts_are_named_at_start_and_in_the_summary(tmp_path, caplog):
    configs = _hosting("0-3", "6-9")
    grid = in_process_grid(client_app, 2, _config(tmp_path), node_configs=configs)
    with caplog.at_level(logging.WARNING):
        summary, evaluations = _run(grid, _config(tmp_path))
    assert "2 clients of the federation's 10 (num-partitions) are hosted by no node at start: 4, 5" in caplog.text
    assert summary["clients_never_hosted"] == [4, 5] and {r["clients-evaluated"] for r in evaluations} == {8}


class _Changing(InProcessGrid):
    """Nodes that come and go: after ``at`` training rounds, the nodes connected are ``later`` (ids of this grid's
    contexts), before it ``first``."""

    def __init__(self, *args: Any, first: list[int], later: list[int], at: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.first, self.later, self.at, self.rounds = first, later, at, 0

    def get_node_ids(self) -> list[int]:
        return list(self.later if self.rounds >= self.at else self.first)

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        replies = super().send_and_receive(messages, timeout=timeout)
        self.rounds += any(m.metadata.message_type == MessageType.TRAIN for m in messages)
        return replies


def _changing(tmp_path, configs, ids, first, later, at) -> _Changing:
    in_process_grid(client_app, 1, {})  # the task identity
    return _Changing(client_app, len(configs), _config(tmp_path), ids, configs, first=first, later=later, at=at)


def test_a_node_that_connects_late_joins_with_its_clients(tmp_path, caplog):
    grid = _changing(tmp_path, _hosting("0-5", "6-9"), [1001, 1002], first=[1001], later=[1001, 1002], at=2)
    with caplog.at_level(logging.INFO):
        summary, evaluations = _run(grid, _config(tmp_path))
    assert "node 1002 joined the run with clients 6, 7, 8, 9" in caplog.text
    assert summary["clients_joined_late"] == [6, 7, 8, 9] and "clients_never_hosted" not in summary
    assert [r["clients-evaluated"] for r in evaluations] == [6, 10, 10, 10]  # round 2 evaluates after it joined
    assert list(tmp_path.glob("*/partition.png")) and "not drawn" not in caplog.text  # clients 6-9: empty at start


def test_a_node_that_reconnects_with_a_new_id_takes_its_clients_and_their_state_back(tmp_path, caplog):
    """SCAFFOLD's clients keep c_i: a node that restarts between rounds (a new node id, a new Context) takes its
    clients back with c_i from their files, to the numbers of a run whose node stayed."""
    configs = _hosting("0-4", "5-9", "5-9")
    stayed = _changing(tmp_path / "stayed", configs, [1001, 1002, 2002], first=[1001, 1002], later=[1001, 1002], at=2)
    came_back = _changing(tmp_path / "back", configs, [1001, 1002, 2002], first=[1001, 1002], later=[1001, 2002], at=2)
    summary, evaluations = _run(stayed, _config(tmp_path / "stayed"))
    with caplog.at_level(logging.INFO):
        summary_back, evaluations_back = _run(came_back, _config(tmp_path / "back"))
    assert "node 2002 joined the run with clients 5, 6, 7, 8, 9 (5 clients back from a node that left)" in caplog.text
    assert summary_back["clients_taken_back"] == 5
    assert [r["accuracy"] for r in evaluations_back] == [r["accuracy"] for r in evaluations]


def test_a_node_that_names_clients_another_connected_node_hosts_is_not_taken(tmp_path, caplog):
    grid = _changing(tmp_path, _hosting("0-4", "5-9", "3-4"), [1001, 1002, 1003], first=[1001, 1002],
                     later=[1001, 1002, 1003], at=1)
    with caplog.at_level(logging.WARNING):
        _run(grid, _config(tmp_path))
    assert "node 1003 joined the run but names clients 3, 4, which node 1001, still connected, host" in caplog.text
