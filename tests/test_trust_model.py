"""The trust model: an instruction to client A carries A's model (the method's output for A when
training, A's stored model when evaluating) and never a copy of another client's parameters."""

from __future__ import annotations

import fabricate as fb
import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord
from flwr.common import parameters_to_ndarrays

import strategies
import strategies.message
from flower_pfl.engine.wire import fingerprint

NAMES, SHAPES = ("fc.weight", "fc.bias"), ((3, 4), (3,))
NODES = list(range(101, 109))


def _secret(node: int) -> dict[str, np.ndarray]:
    """A model only ``node`` trains: different in every entry from every other node's."""
    g = np.random.default_rng(node)
    return {n: (node + g.standard_normal(s)).astype(np.float32) for n, s in zip(NAMES, SHAPES)}


def _flat(arrays) -> torch.Tensor:
    return torch.cat([torch.as_tensor(np.asarray(a)).flatten() for a in arrays])


def _no_copy_of_others(got: torch.Tensor, node: int) -> None:
    for other in NODES:
        if other != node:
            secret = _flat(_secret(other).values())
            assert not torch.allclose(got, secret, atol=1e-3), f"client {node} was sent client {other}'s model"
            sizes = [int(np.prod(s)) for s in SHAPES]
            for mine, theirs in zip(got.split(sizes), secret.split(sizes)):
                assert not torch.allclose(mine, theirs, atol=1e-3), f"client {node} was sent a tensor of client {other}"


MESSAGE = {
    "fedmcsa": lambda: strategies.message.FedMCSA(sigma=1.0, clients_per_round=4, min_available_nodes=1),
    "fedmcsa-all-train": lambda: strategies.message.FedMCSA(sigma=1.0, clients_per_round=4, min_available_nodes=1,
                                                             all_clients_train=True),
    "fedacs": lambda: strategies.message.FedACS(p=0.5, clients_per_round=4, min_available_nodes=1),
    "fedamp": lambda: strategies.message.FedAMP(clients_per_round=4, min_available_nodes=1),
    "heurfedamp": lambda: strategies.message.HeurFedAMP(clients_per_round=4, min_available_nodes=1),
    "local": lambda: strategies.message.Local(clients_per_round=4, min_available_nodes=1),
}


@pytest.mark.parametrize("name", sorted(MESSAGE))
def test_message_api_instructions_carry_only_the_addressees_model(name):
    fb.set_task_identity()
    strat, grid = MESSAGE[name](), fb.FakeGrid(NODES)
    start = ArrayRecord({n: fb.Array(np.zeros(s, np.float32)) for n, s in zip(NAMES, SHAPES)})
    config = ConfigRecord({"lr": 0.1, "local-steps": 2, "batch-size": 4})
    for rnd in (1, 2, 3):  # every node trains its secret model at least once (8 nodes, 4 a round)
        msgs = list(strat.configure_train(rnd, start, config, grid)) if rnd < 3 else [
            m for nid in NODES for m in strat.configure_train(rnd, start, config, fb.FakeGrid([nid]))]
        strat.aggregate_train(rnd, [fb.train_reply(m, _secret(m.metadata.dst_node_id)) for m in msgs])
    train = list(strat.configure_train(4, start, config, grid))
    evaluate = list(strat.configure_evaluate(4, start, ConfigRecord(), grid))
    assert len({id(m.content) for m in train + evaluate}) == len(train) + len(evaluate)  # no shared content
    for msg in evaluate:  # evaluation: exactly the addressee's own stored model
        got = _flat(a.numpy() for a in msg.content["arrays"].values())
        assert torch.equal(got, _flat(_secret(msg.metadata.dst_node_id).values()))
    sampled = strat.server.last_participants
    for msg in train:
        node = msg.metadata.dst_node_id
        got = _flat(a.numpy() for a in msg.content["arrays"].values())
        if node in sampled:  # the rule's output for this node: a mix, not another node's model
            _no_copy_of_others(got, node)
        else:  # all clients train: the others continue from their own model
            assert torch.equal(got, _flat(_secret(node).values()))
        values = [v for rec in msg.content.config_records.values() for v in rec.values()]
        assert not any(isinstance(v, bytes) for v in values)  # nothing opaque rides along
        assert not set(values) & (set(NODES) - {node})  # no other client's id
        assert not {"accuracy", "loss", "train-loss"} & {k for rec in msg.content.config_records.values() for k in rec}


LEGACY = ["FedMCSA", "FedACS", "FedAMP", "HeurFedAMP", "Local"]


@pytest.mark.parametrize("name", LEGACY)
def test_legacy_api_instructions_carry_only_the_addressees_model(name):
    cm = fb.client_manager([str(n) for n in NODES])
    cls = getattr(strategies, name)
    kw = {"sigma": 1.0} if name == "FedMCSA" else {"alpha_k": 0.1} if name == "FedAMP" else {}
    strat = cls(**kw, initial_parameters={n: np.zeros(s, np.float32) for n, s in zip(NAMES, SHAPES)},
                clients_per_round=len(NODES), min_available_clients=1,
                on_fit_config_fn=lambda r: {"lr": 0.1, "local-steps": 2, "batch-size": 4})
    ins = strat.configure_fit(1, strat.initial_parameters, cm)
    strat.aggregate_fit(1, [(p, fb.fit_res(list(_secret(int(p.cid)).values()))) for p, _ in ins], [])
    for proxy, fitins in strat.configure_fit(2, strat.initial_parameters, cm):
        got = _flat(parameters_to_ndarrays(fitins.parameters))
        if name == "Local":
            assert torch.equal(got, _flat(_secret(int(proxy.cid)).values()))
        else:
            _no_copy_of_others(got, int(proxy.cid))
        assert not any(isinstance(v, bytes) for v in fitins.config.values())
        assert not set(fitins.config.values()) & (set(NODES) - {int(proxy.cid)})
    for proxy, evalins in strat.configure_evaluate(2, strat.initial_parameters, cm):
        assert torch.equal(_flat(parameters_to_ndarrays(evalins.parameters)), _flat(_secret(int(proxy.cid)).values()))


def test_fingerprint_is_the_same_for_arrays_and_flat_vector_and_tells_models_apart():
    arrays = list(_secret(101).values())
    assert fingerprint(arrays) == fingerprint([_flat(arrays)]) == fingerprint(torch.as_tensor(a) for a in arrays)
    assert fingerprint(arrays) != fingerprint(_secret(102).values())
