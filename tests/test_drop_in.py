"""The strategies drop into apps written for Flower's FedAvg: every FedAvg argument by name, in each API."""

from __future__ import annotations

import inspect

import fabricate as fb
import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord
from flwr.common import parameters_to_ndarrays
from flwr.server.strategy import FedAvg as LegacyFedAvg
from flwr.serverapp.strategy import FedAvg
from test_twins import NODES, OURS, _model, _needs_bn

import strategies
import strategies.message

ENTRIES = [pytest.param(e, id=e.label) for e in OURS if e.aggregation == "default"]


def _flower_arguments(cls: type) -> dict:
    """Every argument of Flower's FedAvg constructor with its default value."""
    return {name: p.default for name, p in inspect.signature(cls.__init__).parameters.items() if name != "self"}


@pytest.mark.parametrize("entry", ENTRIES)
def test_every_strategy_takes_flowers_fedavg_arguments_by_name(entry):
    message_cls, legacy_cls = getattr(strategies.message, entry.strategy), getattr(strategies, entry.strategy)
    for ours, flowers in ((message_cls, FedAvg), (legacy_cls, LegacyFedAvg)):
        signature = inspect.signature(ours)
        assert all(p.kind is not inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values())
        missing = set(_flower_arguments(flowers)) - set(signature.parameters)
        assert not missing, f"{ours.__name__} lacks {missing}"
    initial = {k: v.numpy() for k, v in _model(bn=_needs_bn(entry)).state_dict().items()}
    message_cls(**_flower_arguments(FedAvg))
    legacy_cls(**{**_flower_arguments(LegacyFedAvg), "initial_parameters": initial})


def _fedmcsa(**options):
    fb.set_task_identity()
    initial = {k: v.numpy() for k, v in _model().state_dict().items()}
    strategy = strategies.message.FedMCSA(clients_per_round=3, min_available_nodes=1, **options)
    return strategy, ArrayRecord({k: torch.as_tensor(v) for k, v in initial.items()}), initial


def test_min_evaluate_nodes_raises_the_number_that_evaluate():
    strategy, arrays, _ = _fedmcsa(fraction_evaluate=0.2, min_evaluate_nodes=3)
    list(strategy.configure_train(1, arrays, ConfigRecord({}), fb.FakeGrid(NODES)))
    assert len(list(strategy.configure_evaluate(1, arrays, ConfigRecord({}), fb.FakeGrid(NODES)))) == 3


def test_weighted_by_key_and_train_metrics_aggr_fn_are_used():
    seen = {}

    def aggregate(records, key):
        seen["key"], seen["n"] = key, [r["metrics"][key] for r in records]
        return MetricRecord({"my-metric": 1.0})

    strategy, arrays, initial = _fedmcsa(weighted_by_key="samples", train_metrics_aggr_fn=aggregate)
    msgs = list(strategy.configure_train(1, arrays, ConfigRecord({}), fb.FakeGrid(NODES)))
    replies = []
    for i, msg in enumerate(msgs):
        reply = fb.train_reply(msg, {k: v + 0.01 for k, v in initial.items()})
        reply.content["metrics"] = MetricRecord({"samples": 5 + i, "train-loss": 0.1})
        replies.append(reply)
    _, metrics = strategy.aggregate_train(1, replies)
    assert seen == {"key": "samples", "n": [5, 6, 7]}
    assert metrics["my-metric"] == 1.0 and metrics["clients-accepted"] == 3


def test_legacy_accept_failures_false_leaves_a_round_with_a_failure_unapplied():
    fb.set_task_identity()
    initial = {k: v.numpy() for k, v in _model().state_dict().items()}
    strategy = strategies.FedMCSA(initial_parameters=initial, clients_per_round=3, min_available_clients=1, accept_failures=False)
    cm = fb.client_manager([str(n) for n in NODES])
    fit = strategy.configure_fit(1, strategy.initial_parameters, cm)
    before = strategy.method.store.get(NODES).clone()
    results = [(proxy, fb.fit_res([v + 0.01 for v in initial.values()])) for proxy, _ in fit[1:]]
    _, metrics = strategy.aggregate_fit(1, results, [RuntimeError("crashed")])
    assert metrics["clients-accepted"] == 0 and torch.equal(strategy.method.store.get(NODES), before)
    strategy.accept_failures = True
    _, metrics = strategy.aggregate_fit(1, results, [RuntimeError("crashed")])
    assert metrics["clients-accepted"] == 2 and not np.array_equal(strategy.method.store.get(NODES), before)


@pytest.mark.parametrize("name", ["FedAMP", "HeurFedAMP"])
def test_fedamp_at_a_learning_rate_that_cannot_train_is_warned_about_once_naming_the_arguments(name, caplog):
    """lr · λ/α_k = 0.05 · 1 / 0.05 = 1: each local step lands on the anchor (FedAMP's defaults)."""
    fb.set_task_identity()
    initial = {k: v.numpy() for k, v in _model().state_dict().items()}
    arrays = ArrayRecord({k: torch.as_tensor(v) for k, v in initial.items()})
    strategy = getattr(strategies.message, name)(clients_per_round=3, min_available_nodes=1)
    for rnd in (1, 2):
        list(strategy.configure_train(rnd, arrays, ConfigRecord({"lr": 0.05}), fb.FakeGrid(NODES)))
    warnings = [r.getMessage() for r in caplog.records if "cannot train" in r.getMessage()]
    assert len(warnings) == 1 and "fedamp-lambda / fedamp-alpha-k" in warnings[0] and "= 1 >= 1" in warnings[0]
    caplog.clear()
    legacy = getattr(strategies, name)(initial_parameters=initial, clients_per_round=3, min_available_clients=1,
                                       on_fit_config_fn=lambda rnd: {"lr": 0.01})
    legacy.configure_fit(1, legacy.initial_parameters, fb.client_manager([str(n) for n in NODES]))
    assert not [r for r in caplog.records if "cannot train" in r.getMessage()]  # 0.01 · 20 = 0.2: fine


@pytest.mark.parametrize("method", ["fedamp", "heurfedamp"])
def test_the_package_app_refuses_a_fedamp_run_that_cannot_train(method):
    from flower_pfl.experiment.config import ConfigError, ExperimentConfig

    base = {**ExperimentConfig().to_run_config(), "method": method}
    with pytest.raises(ConfigError, match="'fedamp-lambda'.*could not train"):
        ExperimentConfig.from_mapping({**base, "lr": 0.05})
    ExperimentConfig.from_mapping({**base, "lr": 0.04})  # 0.04 · 1 / 0.05 = 0.8


@pytest.mark.parametrize("api", ["message", "legacy"])
@pytest.mark.parametrize("name,algorithm", [("SCAFFOLD", "ScaffoldCorrection"), ("FedAttn", "FedAttnClient")])
def test_a_method_whose_clients_lack_its_client_algorithm_says_so_once_and_fails_when_none_has_it(api, name, algorithm, caplog):
    from test_twins import Clients

    from flower_pfl.engine.reply_checks import ClientAlgorithmNotRun

    fb.set_task_identity()
    initial = {k: v.numpy() for k, v in _model().state_dict().items()}
    names = list(initial)
    clients = Clients()

    def replies(rnd, strategy, plain):
        """A round in which the nodes in ``plain`` run a plain client (no extras)."""
        if api == "message":
            arrays = ArrayRecord({k: torch.as_tensor(v) for k, v in initial.items()})
            msgs = list(strategy.configure_train(rnd, arrays, ConfigRecord({"lr": 0.05, "local-steps": 2, "batch-size": 4}),
                                                 fb.FakeGrid(NODES)))
            out = []
            for m in msgs:
                trained, n, extras = clients.train(m.metadata.dst_node_id, [a.numpy() for a in m.content["arrays"].values()],
                                                   dict(m.content["config"]))
                keep = m.metadata.dst_node_id not in plain
                out.append(fb.train_reply(m, dict(zip(names, trained)), n, extras=extras if keep else None))
            return strategy.aggregate_train(rnd, out)
        cm = fb.client_manager([str(n) for n in NODES])
        fit = strategy.configure_fit(rnd, strategy.initial_parameters, cm)
        results = []
        for proxy, ins in fit:
            trained, n, extras = clients.train(int(proxy.cid), parameters_to_ndarrays(ins.parameters), dict(ins.config))
            results.append((proxy, fb.fit_res(trained, n, extras if int(proxy.cid) not in plain else None)))
        return strategy.aggregate_fit(rnd, results, [])

    def make():
        if api == "message":
            return getattr(strategies.message, name)(clients_per_round=5, min_available_nodes=1)
        return getattr(strategies, name)(initial_parameters=initial, clients_per_round=5, min_available_clients=1,
                                         on_fit_config_fn=lambda rnd: {"lr": 0.05, "local-steps": 2, "batch-size": 4})

    strategy = make()
    _, metrics = replies(1, strategy, plain={NODES[0]})  # one plain client: warned, refused, the round goes on
    replies(2, strategy, plain={NODES[0]})
    warnings = [r.getMessage() for r in caplog.records if "does not run it" in r.getMessage()]
    assert metrics["clients-rejected"] == 1 and len(warnings) == 1 and algorithm in warnings[0] and "algorithm_for" in warnings[0]
    with pytest.raises(ClientAlgorithmNotRun, match=f"{algorithm}.*cannot work"):
        replies(1, make(), plain=set(NODES))  # nobody runs it: the run ends and says why


@pytest.mark.parametrize("name", ["SCAFFOLD", "IGFL", "FedAttn"])
def test_settings_a_client_algorithm_needs_are_sent_from_the_strategys_arguments_or_asked_for(name, caplog):
    fb.set_task_identity()
    initial = {k: v.numpy() for k, v in _model().state_dict().items()}
    arrays = ArrayRecord({k: torch.as_tensor(v) for k, v in initial.items()})
    bare = getattr(strategies.message, name)(clients_per_round=2, min_available_nodes=1)
    list(bare.configure_train(1, arrays, ConfigRecord({"batch-size": 4}), fb.FakeGrid(NODES)))
    (warning,) = [r.getMessage() for r in caplog.records if "lacks" in r.getMessage()]
    assert "'lr'" in warning and "'local-steps'" in warning and bare.method_class.client.__name__ in warning
    caplog.clear()
    given = getattr(strategies.message, name)(clients_per_round=2, min_available_nodes=1, lr=0.05, local_steps=3)
    msgs = list(given.configure_train(1, arrays, ConfigRecord({"batch-size": 4, "lr": 0.01}), fb.FakeGrid(NODES)))
    assert all(m.content["config"]["lr"] == 0.01 and m.content["config"]["local-steps"] == 3 for m in msgs)  # the app's own lr wins
    assert not [r for r in caplog.records if "lacks" in r.getMessage()]
    legacy = getattr(strategies, name)(initial_parameters=initial, clients_per_round=2, min_available_clients=1, lr=0.05, local_steps=3)
    fit = legacy.configure_fit(1, legacy.initial_parameters, fb.client_manager([str(n) for n in NODES]))
    assert all(ins.config["lr"] == 0.05 and ins.config["local-steps"] == 3 for _, ins in fit)
