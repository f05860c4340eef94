"""Each method's declaration of what its server needs of the replies (``has_global_model``,
``aggregate_only``, ``flower_pfl.engine.server_algorithm``) is what its server does, checked with real
client algorithms."""

from __future__ import annotations

import copy

import fabricate as fb
import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord
from test_twins import NODES, OURS, TRAINING, Clients, _twins


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
