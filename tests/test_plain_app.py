"""Every strategy dropped into an app that was not written for it (``examples/plain_app``): a plain-SGD
client reporting ``eval-acc`` / ``eval-loss``, a ServerApp that builds its strategy from an import path,
and a legacy twin. The run goes exactly as the client-contract table of docs/client-contract.md says: it trains and reports
the app's own metric names, warns once where the method asks the client for more than plain training,
and fails with the reason where the method cannot work without it. The server and client code are what
``flwr run`` executes (``server_apps.inprocess`` leaves out only the transport)."""

from __future__ import annotations

import json
import logging
import sys

import fabricate as fb
import pytest
import torch
from conftest import ROOT
from flwr.server import ServerConfig

from client_apps.flower_internals import start_grid
from client_apps.own_loop import algorithm_for
from flower_pfl.engine.reply_checks import ClientAlgorithmNotRun
from server_apps.inprocess import InProcessGrid

sys.path.insert(0, str(ROOT / "examples" / "plain_app"))
from plain_app import legacy, server_app
from plain_app.client_app import app as client_app

NODES, ROUNDS = 6, 6
CONFIG = {"num-rounds": ROUNDS, "fraction-train": 0.5, "lr": 0.1, "local-steps": 10}
#: docs/client-contract.md's table, column "if the client ignores it": nothing to ignore, a warning, or a failure
PLAIN = ["FedACS", "Local", "FedPer", "LGFedAvg", "PFedHN", "CFL"]
WARNS = ["FedMCSA", "FedAMP", "HeurFedAMP", "IGFL", "PFedMe", "Ditto", "APFL", "PerFedAvg", "FedRep", "FedBABU", "FedRoD",
         "FedDyn", "MOON", "APPLE", "FedALA", "KNNPer"]
FAILS = ["SCAFFOLD", "FedAttn", "FedProto", "FedFomo", "IFCA"]
#: methods whose personalization lives in the server's store: with a plain client they still personalize
SERVER_PERSONALIZED = ["FedACS", "Local", "FedPer", "FedMCSA", "FedAMP", "HeurFedAMP", "LGFedAvg", "FedRep"]


def _run(api: str, strategy: str, args: dict) -> dict[int, dict[str, float]]:
    """The app's evaluation metrics per round."""
    fb.set_task_identity()
    cfg = {**CONFIG, "strategy": strategy, "strategy-args": json.dumps(args)}
    if api == "message":
        result = server_app.run(InProcessGrid(client_app, NODES, cfg), cfg)  # type: ignore[arg-type]
        return {rnd: dict(m) for rnd, m in result.evaluate_metrics_clientapp.items()}
    context = type("Context", (), {"run_config": cfg})()
    parts = legacy.server_fn(context)  # type: ignore[arg-type]
    history = start_grid(grid=InProcessGrid(legacy.client_app, NODES, cfg), strategy=parts.strategy,  # type: ignore[arg-type]
                         config=ServerConfig(num_rounds=ROUNDS))
    rounds: dict[int, dict[str, float]] = {}
    for key, values in history.metrics_distributed.items():
        for rnd, value in values:
            rounds.setdefault(rnd, {})[key] = value
    for rnd, loss in history.losses_distributed:
        rounds.setdefault(rnd, {})["loss"] = loss
    return rounds


def _ours(api: str, name: str) -> str:
    return f"strategies.message.{name}" if api == "message" else f"strategies.{name}"


@pytest.fixture(scope="module")
def flower_fedavg() -> dict[str, dict[int, dict[str, float]]]:
    """Flower's own FedAvg in the same app, both APIs: the figure the methods are compared with."""
    return {"message": _run("message", "flwr.serverapp.strategy.FedAvg", {}),
            "legacy": _run("legacy", "flwr.server.strategy.FedAvg", {})}


@pytest.mark.parametrize("api", ["message", "legacy"])
@pytest.mark.parametrize("name", PLAIN + WARNS)
def test_a_strategy_runs_in_a_plain_app_under_the_apps_metric_names(api, name, flower_fedavg, caplog):
    caplog.set_level(logging.WARNING)
    rounds = _run(api, _ours(api, name), {"accuracy_key": "eval-acc"})
    assert sorted(rounds) == list(range(1, ROUNDS + 1))
    flower = flower_fedavg[api][ROUNDS]
    final = rounds[ROUNDS]
    assert set(flower) <= set(final)  # every metric Flower's FedAvg reports, under the app's names
    assert {"eval-acc-mean", "eval-acc-std", "eval-acc-min", "eval-acc-bmta", "clients-evaluated"} <= set(final)
    assert final["clients-evaluated"] == NODES and 0 <= final["eval-acc-min"] <= final["eval-acc-mean"] <= 1
    assert final["eval-acc-bmta"] == max(r["eval-acc-mean"] for r in rounds.values())
    if name in SERVER_PERSONALIZED:  # half the clients name the classes the other way round: one model serves half
        assert final["eval-acc"] > flower["eval-acc"] + 0.2, (final["eval-acc"], flower["eval-acc"])
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno >= logging.WARNING and "Using a strategy in your own Flower app" in r.getMessage()]
    assert len(warnings) == (1 if name in WARNS else 0), warnings
    if name in WARNS:
        assert "client_apps.app" in warnings[0] or "algorithm_for" in warnings[0], warnings
    assert not [r.getMessage() for r in caplog.records if "no client reports" in r.getMessage()]


@pytest.mark.parametrize("api", ["message", "legacy"])
@pytest.mark.parametrize("name", FAILS)
def test_a_method_that_cannot_work_without_its_client_algorithm_ends_the_run_saying_so(api, name):
    """The error names the fix that works: the user's own loop through ``algorithm_for`` where the client
    algorithm is a hook on one, else the package's ClientApp (``algorithm_for`` refuses those)."""
    with pytest.raises(ClientAlgorithmNotRun) as stopped:
        _run(api, _ours(api, name), {"accuracy_key": "eval-acc"})
    import strategies.message

    client = getattr(strategies.message, name).method_class.client
    if client.hookable:
        assert "train with client_apps.own_loop.algorithm_for(config, model, context.state)" in str(stopped.value)
    else:
        assert 'use the package\'s ClientApp (clientapp = "client_apps.app:app"' in str(stopped.value)
        assert "train with client_apps.own_loop" not in str(stopped.value)
        with pytest.raises(ValueError, match="use client_apps.app's ClientApp"):
            algorithm_for({"client-algorithm": client.name, "lr": 0.1, "local-steps": 1}, torch.nn.Linear(2, 2))


@pytest.mark.parametrize("api", ["message", "legacy"])
def test_a_method_that_cannot_run_on_the_apps_model_says_why_before_a_round(api):
    """FedBN keeps batch-normalization layers local; the plain app's model has none."""
    with pytest.raises(ValueError, match="FedBN cannot run on this model: it needs a model with batch normalization"):
        _run(api, _ours(api, "FedBN"), {"accuracy_key": "eval-acc"})


@pytest.mark.parametrize("api", ["message", "legacy"])
def test_without_accuracy_key_the_run_goes_on_and_says_which_metrics_the_clients_report(api, caplog):
    rounds = _run(api, _ours(api, "FedACS"), {})
    assert all("eval-acc" in m and "accuracy-mean" not in m for m in rounds.values())
    said = [r.getMessage() for r in caplog.records if "no client reports 'accuracy'" in r.getMessage()]
    assert len(said) == 1 and "eval-acc" in said[0]


@pytest.mark.parametrize("rank_query", [False, True])
def test_the_run_config_says_whether_the_apps_clients_answer_the_rank_query(rank_query, caplog):
    """The app answers queries (``@app.query()``): its run config may say so, ``strategy-args =
    '{"rank_query": true}'``, and the nodes are ranked before the first draw; without it nobody is asked and
    one line says how nodes are ranked until their replies say."""
    caplog.set_level(logging.WARNING)
    rounds = _run("message", "strategies.message.FedMCSA", {"accuracy_key": "eval-acc", "rank_query": rank_query,
                                                             "clients_per_round": 3})  # a draw: 3 of 6
    assert sorted(rounds) == list(range(1, ROUNDS + 1))
    unranked = [r.getMessage() for r in caplog.records if "not reported 'partition-id'" in r.getMessage()]
    assert len(unranked) == (0 if rank_query else 1), unranked
