"""Each method's declaration of what its server needs of the replies (``has_global_model``,
``aggregate_only``, ``flower_pfl.engine.server_algorithm``) is what its server does, checked with real
client algorithms; Flower's central-DP wrappers around a method that needs only the replies' mean: its
clients get the noised global model the wrapper returns."""

from __future__ import annotations

import copy
import json
import logging
import sys
from types import SimpleNamespace

import fabricate as fb
import flwr.server.strategy as legacy_strategy
import flwr.serverapp.strategy as message_strategy
import numpy as np
import pytest
import torch
from conftest import ROOT
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType
from flwr.clientapp import ClientApp
from flwr.common import parameters_to_ndarrays
from flwr.server import ServerConfig
from test_twins import NODES, OURS, TRAINING, Clients, _twins

import strategies.message
from client_apps.flower_internals import start_grid
from server_apps.inprocess import InProcessGrid

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
