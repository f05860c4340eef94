"""Flower's privacy mechanisms around this package's strategies (docs/privacy.md): each method's declaration
(``has_global_model``, ``aggregate_only``) is what its server does; central-DP wrappers and secure
aggregation run the methods whose server needs only the replies' mean and refuse every other method at
their first call, naming the method, the mechanism and why; ``evaluate_fn`` is refused without a global
model. Real wrapper and workflow runs show a refused method and a method that composes (its clients get
the noised model; under SecAgg+ it trains on the aggregate)."""

from __future__ import annotations

import copy
import functools
import inspect
import json
import logging
import math
import sys
from types import SimpleNamespace

import fabricate as fb
import flwr.server.strategy as legacy_strategy
import flwr.serverapp.strategy as message_strategy
import numpy as np
import pytest
import torch
from conftest import ROOT
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.clientapp.mod import LocalDpMod
from flwr.common import parameters_to_ndarrays
from flwr.server import LegacyContext, ServerConfig
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
from test_twins import NODES, OURS, TRAINING, Clients, _twins

import strategies.message
from client_apps.flower_internals import start_grid
from flower_pfl.engine.params import param_specs
from server_apps.inprocess import InProcessGrid
from strategies.privacy import CENTRAL_DP

sys.path.insert(0, str(ROOT / "examples" / "plain_app"))
from plain_app import client_app as plain_client
from plain_app import legacy as plain_legacy
from plain_app.task import Net


def _flat_record(record: ArrayRecord) -> torch.Tensor:
    """An ArrayRecord's arrays as one flat tensor."""
    return fb.flat({k: v.numpy() for k, v in record.items()})


def _weighted_mean(replies: list[tuple[dict[str, np.ndarray], int]]) -> dict[str, np.ndarray]:
    """The replies' sample-weighted mean, by name: all that secure aggregation leaves a server."""
    total = sum(n for _, n in replies)
    return {name: np.asarray(sum(arrays[name].astype(np.float64) * n for arrays, n in replies) / total, like.dtype)
            for name, like in replies[0][0].items()}


def _observed(entry, rounds: int = 2) -> tuple[set[bool], bool]:
    """Two rounds of the entry's Message-API strategy with real client algorithms: whether the strategy handed
    Flower a global model each round, and whether it needed nothing but the replies' mean (every trainer got
    the global model, and the replies' mean in place of every reply gave the same next model)."""
    fb.set_task_identity()
    _, strategy, initial = _twins(entry)
    clients, grid = Clients(), fb.FakeGrid(NODES)
    arrays = ArrayRecord({k: torch.as_tensor(v) for k, v in initial.items()})
    returned, mean_only = set(), True
    for rnd in range(1, rounds + 1):
        msgs = list(strategy.configure_train(rnd, arrays, ConfigRecord(dict(TRAINING)), grid))
        mean_only &= all(torch.equal(fb.sent(msg), _flat_record(arrays)) for msg in msgs)
        trained = []
        for msg in msgs:
            values, n, extras = clients.train(msg.metadata.dst_node_id, [a.numpy() for a in msg.content["arrays"].values()],
                                              dict(msg.content["config"]))
            trained.append((msg, dict(zip(initial, values)), n, extras or None))
        twin = copy.deepcopy(strategy)
        new, _ = strategy.aggregate_train(rnd, [fb.train_reply(msg, a, n, extras=x) for msg, a, n, x in trained])
        mean = _weighted_mean([(a, n) for _, a, n, _ in trained])
        from_mean, _ = twin.aggregate_train(rnd, [fb.train_reply(msg, mean, n, extras=x) for msg, _, n, x in trained])
        returned.add(new is not None)
        mean_only &= new is not None and from_mean is not None and torch.allclose(_flat_record(new), _flat_record(from_mean),
                                                                                   atol=1e-5)
        arrays = new if new is not None else arrays
    return returned, mean_only


@pytest.mark.parametrize("entry", OURS, ids=[e.label for e in OURS])
def test_a_methods_declaration_is_what_its_server_does(entry):
    """``has_global_model``: the strategy hands Flower's loop a global model every round; ``aggregate_only``:
    its server needs nothing but the replies' mean (and its clients send nothing besides their models). Both
    ways: a method that needs only the mean and does not say so would be refused for nothing."""
    method = entry.declaration
    returned, mean_only = _observed(entry)
    assert returned == {method.has_global_model}
    assert (mean_only and not method.client.reply_keys) == method.aggregate_only


# --- every method inside every central-DP wrapper, secure aggregation, evaluate_fn --------------------------------

#: each Flower API's central-DP wrappers, in the package's list (``DPFedAvgAdaptive`` is a ``DPFedAvgFixed``)
MESSAGE_DP = [w for w in CENTRAL_DP if w.__module__.startswith("flwr.serverapp")]
LEGACY_DP = [w for w in CENTRAL_DP if w not in MESSAGE_DP] + [legacy_strategy.DPFedAvgAdaptive]
DP_ARGS = {"noise_multiplier": 1.0, "clipping_norm": 1.0, "clip_norm": 1.0, "num_sampled_clients": 3, "clipped_count_stddev": 1.0,
           "clip_count_stddev": 1.0}


def _wrapped(wrapper: type, strategy):
    """``strategy`` inside ``wrapper`` (its noise for the round's 3 clients, a clipping norm of 1)."""
    accepted = inspect.signature(wrapper).parameters
    return wrapper(strategy, **{k: v for k, v in DP_ARGS.items() if k in accepted})


def _configure(api: str, outer, initial: dict[str, np.ndarray], params) -> list:
    """The first training round's instructions ``outer`` (a strategy, or a wrapper around one) sends."""
    fb.set_task_identity()
    if api == "message":
        arrays = ArrayRecord({k: torch.as_tensor(v) for k, v in initial.items()})
        return list(outer.configure_train(1, arrays, ConfigRecord(dict(TRAINING)), fb.FakeGrid(NODES)))
    return outer.configure_fit(1, params, fb.client_manager([str(n) for n in NODES]))


def _assert_refusal(text: str, method: str, mechanism: str) -> None:
    assert f"{method} cannot run inside Flower's {mechanism}: " in text and "docs/privacy.md" in text, text


def _central_dp_cases() -> list:
    every = [(api, w, e) for api, wrappers in (("message", MESSAGE_DP[:1]), ("legacy", LEGACY_DP[:1])) for w in wrappers for e in OURS]
    both = [(api, w, e) for api, wrappers in (("message", MESSAGE_DP[1:]), ("legacy", LEGACY_DP[1:])) for w in wrappers
            for e in OURS if e.label in ("ditto", "fedmcsa", "scaffold")]
    return [pytest.param(*case, id=f"{case[0]}-{case[1].__name__}-{case[2].label}") for case in every + both]


@pytest.mark.parametrize("api,wrapper,entry", _central_dp_cases())
def test_central_dp_runs_a_method_that_needs_only_the_mean_and_refuses_every_other_at_once(api, wrapper, entry):
    """Every registry entry inside each API's server-side fixed-clipping wrapper; each other wrapper (client-side,
    adaptive, the deprecated DPFedAvg ones) around one method of each kind."""
    legacy, message, initial = _twins(entry)
    outer = _wrapped(wrapper, message if api == "message" else legacy)
    if entry.declaration.aggregate_only:
        assert len(_configure(api, outer, initial, legacy.initial_parameters)) == 3
        return
    with pytest.raises(ValueError) as refused:
        _configure(api, outer, initial, legacy.initial_parameters)
    _assert_refusal(str(refused.value), entry.strategy, wrapper.__name__)
    reason = "no global model" if not entry.declaration.has_global_model else "each reply"
    assert reason in str(refused.value)


class SilentGrid:
    """A grid that knows no node and answers nothing: Flower's legacy workflows run around the strategy alone
    (its clients are the client manager's)."""

    run = SimpleNamespace(run_id=1)

    def __init__(self) -> None:
        self.sent: list[str] = []

    def get_node_ids(self) -> list[int]:
        return []

    def send_and_receive(self, messages, *, timeout=None) -> list:
        self.sent += [m.metadata.message_type for m in messages]
        return []


@pytest.mark.parametrize("entry", OURS, ids=[e.label for e in OURS])
def test_secure_aggregation_runs_a_method_that_needs_only_the_mean_and_refuses_every_other_at_once(entry):
    """Flower's SecAgg+ workflow around every registry entry's legacy strategy, one round: a method that needs only
    the replies' mean passes its first ``configure_fit`` and the workflow sends its setup messages; any other
    method stops the run there, before any message goes out."""
    fb.set_task_identity()
    legacy, _, _ = _twins(entry)
    manager = fb.client_manager([str(n) for n in NODES])
    for proxy in manager.all().values():
        proxy.node_id = int(proxy.cid)
    context = LegacyContext(Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={}),
                            config=ServerConfig(num_rounds=1), strategy=legacy, client_manager=manager)
    grid = SilentGrid()
    run = DefaultWorkflow(fit_workflow=SecAggPlusWorkflow(num_shares=3, reconstruction_threshold=2))
    if entry.declaration.aggregate_only:
        run(grid, context)  # type: ignore[arg-type]
        assert grid.sent[0] == MessageType.TRAIN  # the protocol's setup stage
        return
    with pytest.raises(ValueError) as refused:
        run(grid, context)  # type: ignore[arg-type]
    _assert_refusal(str(refused.value), entry.strategy, "SecAggPlusWorkflow")
    assert grid.sent == []


@pytest.mark.parametrize("entry", OURS, ids=[e.label for e in OURS])
def test_evaluate_fn_is_refused_without_a_global_model_in_both_apis(entry):
    legacy, message, initial = _twins(entry)
    seen: list[int] = []

    def evaluate(server_round, arrays, config=None):
        seen.append(server_round)

    arrays = ArrayRecord({k: torch.as_tensor(v) for k, v in initial.items()})
    start = functools.partial(message.start, grid=fb.FakeGrid(NODES), initial_arrays=arrays, num_rounds=0, evaluate_fn=evaluate)
    build = functools.partial(type(legacy), initial_parameters=initial, evaluate_fn=evaluate,
                              **{s.name: getattr(legacy.method, s.name) for s in param_specs(type(legacy.method))})
    if entry.declaration.has_global_model:
        start()
        assert seen == [0]
        assert build().evaluate(1, legacy.initial_parameters) is None and seen == [0, 1]
        return
    for make in (start, build):
        with pytest.raises(ValueError, match=f"{entry.strategy} sends each client a model of its own and has no global "
                                             "model.*evaluate_fn.*docs/privacy.md"):
            make()
    assert seen == []


# --- real runs in a plain Flower app (examples/plain_app), in process --------------------------------------------

PLAIN_NODES, PLAIN_CONFIG = 4, {"lr": 0.1, "local-steps": 10}


class SpyGrid(InProcessGrid):
    """The in-process grid, keeping the training messages it delivers."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.trained: list[Message] = []

    def send_and_receive(self, messages, *, timeout=None) -> list[Message]:
        messages = list(messages)
        self.trained += [m for m in messages if m.metadata.message_type == MessageType.TRAIN]
        return super().send_and_receive(messages, timeout=timeout)


def _plain_grid(api: str, client: ClientApp | None = None) -> SpyGrid:
    """The plain app's nodes in process, each running its ClientApp of ``api`` (or ``client``)."""
    fb.set_task_identity()
    return SpyGrid(client or (plain_client.app if api == "message" else plain_legacy.client_app), PLAIN_NODES, PLAIN_CONFIG)


def _message_run(strategy, grid: SpyGrid, rounds: int = 2) -> list:
    """``rounds`` rounds of ``strategy`` (a Message-API strategy, or a wrapper around one) on ``grid``; what each
    round's ``aggregate_train`` returned."""
    returned: list = []
    aggregate = strategy.aggregate_train
    strategy.aggregate_train = lambda rnd, replies: returned.append(aggregate(rnd, replies)) or returned[-1]
    strategy.start(grid=grid, initial_arrays=ArrayRecord(Net().state_dict()), num_rounds=rounds,
                   train_config=ConfigRecord(PLAIN_CONFIG))
    return returned


def _legacy_strategy(name: str, rounds: int):
    """The plain app's legacy strategy: ``strategies.<name>``, or Flower's own at the import path ``name``."""
    ours = "." not in name
    cfg = {"num-rounds": rounds, "fraction-train": 1.0, **PLAIN_CONFIG, "strategy": f"strategies.{name}" if ours else name,
           "strategy-args": json.dumps({"accuracy_key": "eval-acc"} if ours else {})}
    return plain_legacy.server_fn(SimpleNamespace(run_config=cfg)).strategy  # type: ignore[arg-type]


def _legacy_run(strategy, grid: SpyGrid, rounds: int = 2) -> None:
    """``rounds`` rounds of ``strategy`` (a legacy strategy, or a wrapper around one) on ``grid``."""
    start_grid(grid=grid, strategy=strategy, config=ServerConfig(num_rounds=rounds))  # type: ignore[arg-type]


def test_message_api_central_dp_noise_reaches_the_clients_of_ditto(caplog):
    """Ditto inside the server-side fixed-clipping wrapper: the wrapper adds its noise, and the second round's
    clients get the noised model it returned, which the strategy goes on from."""
    caplog.set_level(logging.INFO)
    ditto = strategies.message.Ditto(fraction_train=1.0, accuracy_key="eval-acc")
    grid = _plain_grid("message")
    returned = _message_run(message_strategy.DifferentialPrivacyServerSideFixedClipping(
        ditto, noise_multiplier=1.0, clipping_norm=0.5, num_sampled_clients=PLAIN_NODES), grid)
    assert sum("central DP noise with" in r.getMessage() for r in caplog.records) == 2
    noised = _flat_record(returned[0][0])
    assert [torch.equal(fb.sent(m), noised) for m in grid.trained[PLAIN_NODES:]] == [True] * PLAIN_NODES
    assert torch.equal(ditto.method.global_model(), _flat_record(returned[1][0]))


def test_legacy_central_dp_noise_reaches_the_clients_of_ditto(caplog):
    caplog.set_level(logging.INFO)
    ditto = _legacy_strategy("Ditto", 2)
    sent, configure = [], ditto.configure_fit
    ditto.configure_fit = lambda *a: sent.append(configure(*a)) or sent[-1]
    dp = legacy_strategy.DifferentialPrivacyServerSideFixedClipping(ditto, noise_multiplier=1.0, clipping_norm=0.5,
                                                                    num_sampled_clients=PLAIN_NODES)
    returned, aggregate = [], dp.aggregate_fit
    dp.aggregate_fit = lambda *a: returned.append(aggregate(*a)) or returned[-1]
    _legacy_run(dp, _plain_grid("legacy"))
    assert sum("central DP noise with" in r.getMessage() for r in caplog.records) == 2
    noised = fb.flat(parameters_to_ndarrays(returned[0][0]))
    assert [torch.equal(fb.flat(parameters_to_ndarrays(ins.parameters)), noised) for _, ins in sent[1]] == [True] * PLAIN_NODES


@pytest.mark.parametrize("api", ["message", "legacy"])
def test_central_dp_around_fedmcsa_is_refused_before_any_client_trains(api):
    """FedMCSA, which keeps a model per client, inside a server-side wrapper (Message API) or a client-side one
    (legacy API, whose clients would clip with ``fixedclipping_mod``): refused at the first round."""
    grid, dp = _plain_grid(api), {"noise_multiplier": 1.0, "clipping_norm": 0.5, "num_sampled_clients": PLAIN_NODES}
    if api == "message":
        wrapper = message_strategy.DifferentialPrivacyServerSideFixedClipping
        run = functools.partial(_message_run, wrapper(strategies.message.FedMCSA(fraction_train=1.0), **dp), grid)
    else:
        wrapper = legacy_strategy.DifferentialPrivacyClientSideFixedClipping
        run = functools.partial(_legacy_run, wrapper(_legacy_strategy("FedMCSA", 2), **dp), grid)
    with pytest.raises(ValueError) as refused:
        run()
    _assert_refusal(str(refused.value), "FedMCSA", wrapper.__name__)
    assert grid.trained == []
    assert "no global model" in str(refused.value) and "add its noise to nothing" in str(refused.value)


def _secure_grid() -> SpyGrid:
    """The plain app's legacy clients, each behind ``secaggplus_mod``."""
    return _plain_grid("legacy", ClientApp(client_fn=plain_legacy.client_fn, mods=[secaggplus_mod]))


def _secure_run(strategy, grid: SpyGrid, rounds: int = 3) -> LegacyContext:
    """``rounds`` rounds of Flower's SecAgg+ workflow around ``strategy`` (legacy) on ``grid``; the run's context
    (its history)."""
    context = LegacyContext(Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={}),
                            config=ServerConfig(num_rounds=rounds), strategy=strategy)
    DefaultWorkflow(fit_workflow=SecAggPlusWorkflow(num_shares=PLAIN_NODES, reconstruction_threshold=3))(grid, context)  # type: ignore[arg-type]
    return context


def test_secure_aggregation_trains_flowers_fedavg_and_ditto_on_the_mean():
    """In process as under ``flwr run`` (each node its own copy of the protocol's messages), Flower's FedAvg and
    Ditto, whose server needs only the replies' mean, train on SecAgg+'s float64 mean, no reply refused."""
    for name in ("flwr.server.strategy.FedAvg", "Ditto"):
        history = _secure_run(_legacy_strategy(name, 3), _secure_grid()).history
        accuracy = [value for _, value in history.metrics_distributed["eval-acc"]]
        assert accuracy[-1] > accuracy[0] + 0.05, (name, accuracy)
    assert [value for _, value in history.metrics_distributed_fit["clients-rejected"]] == [0, 0, 0]


def test_secure_aggregation_around_fedmcsa_is_refused_before_any_client_trains():
    grid = _secure_grid()
    with pytest.raises(ValueError) as refused:
        _secure_run(_legacy_strategy("FedMCSA", 3), grid)
    _assert_refusal(str(refused.value), "FedMCSA", "SecAggPlusWorkflow")
    assert "as FedAvg does" in str(refused.value) and grid.trained == []


def test_local_dp_on_the_training_messages_composes_with_fedmcsa(caplog):
    """Flower's LocalDpMod on the clients' training messages, FedMCSA on the server: every reply is clipped and
    noised before the server sees it, and the personalized server takes it (with the update bound lifted for
    noise larger than the model, ``max_update_ratio``)."""
    caplog.set_level(logging.INFO)
    client = ClientApp()
    client.train(mods=[LocalDpMod(clipping_norm=1.0, sensitivity=1.0, epsilon=1.0, delta=1e-5)])(plain_client.train_fn)
    client.evaluate()(plain_client.evaluate_fn)
    fedmcsa = strategies.message.FedMCSA(fraction_train=1.0, accuracy_key="eval-acc", max_update_ratio=math.inf)
    returned = _message_run(fedmcsa, _plain_grid("message", client))
    assert sum("LocalDpMod: local DP noise" in r.getMessage() for r in caplog.records) == 2 * PLAIN_NODES
    assert [dict(metrics)["clients-accepted"] for _, metrics in returned] == [PLAIN_NODES] * 2
