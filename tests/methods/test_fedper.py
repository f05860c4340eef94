"""FedPer: federated base layers, personal heads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flower_pfl.engine.client_algorithm import ClientAlgorithm, TrainData, train_locally
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.engine.reply_checks import RawReply
from flower_pfl.experiment.models import DNN
from flower_pfl.methods.fedper import FedPer

from .runs import assert_as_recorded


def _named(value: float) -> dict[str, np.ndarray]:
    """A DNN-shaped model (fc1: base, fc2: head) with every entry ``value``."""
    shapes = {"fc1.weight": (2, 3), "fc1.bias": (2,), "fc2.weight": (2, 2), "fc2.bias": (2,)}
    return {k: np.full(s, value, dtype=np.float32) for k, s in shapes.items()}


def _server(**kwargs) -> MethodServer:
    server = MethodServer(FedPer(**kwargs), clients_per_round=2)
    server.initialize(_named(0.0))
    return server


def _reply(cid: int, value: float, n: int) -> RawReply:
    arrays = _named(value)
    return RawReply(cid, list(arrays.values()), list(arrays), n, {"num-examples": n})


def test_base_is_the_weighted_mean_and_heads_stay_with_their_clients():
    server = _server()
    assert server.method.base_slice == slice(0, 2 * 3 + 2)  # fc1 (the leading columns) is the base, fc2 the head
    server.plan_training(1, [1, 2])
    server.aggregate(1, [server.check(_reply(1, 1.0, 1)), server.check(_reply(2, 4.0, 3))])
    torch.testing.assert_close(server.method.base, torch.full((8,), 1.0 * 0.25 + 4.0 * 0.75))  # by hand: 3.25
    sent = {ins.client_id: ins.model for ins in server.plan_evaluation(1, [1, 2, 3], 1.0)}
    for cid, head in ((1, 1.0), (2, 4.0), (3, 0.0)):  # client 3 never trained: the initial head
        assert torch.all(sent[cid][:8] == 3.25) and torch.all(sent[cid][8:] == head)


def test_a_head_without_a_base_or_a_model_without_names_is_refused():
    with pytest.raises(ValueError, match="leaves no body layer"):
        _server(head_layers=2)  # both of the DNN's layers: that is Local
    server = MethodServer(FedPer(), clients_per_round=2)
    with pytest.raises(ValueError, match="parameter name"):
        server.initialize({str(i): a for i, a in enumerate(_named(0.0).values())})  # a legacy Parameters has no names


def test_head_layers_must_be_positive():
    with pytest.raises(ValueError, match="head_layers = 0 is invalid"):
        FedPer(head_layers=0)


def test_client_is_plain_local_sgd_in_a_user_loop_too():
    torch.manual_seed(0)
    model, mine = DNN(3, 2, hidden=2), DNN(3, 2, hidden=2)
    mine.load_state_dict(model.state_dict())
    x = torch.randn(8, 3)
    y = (x[:, 0] > 0).long()
    train_locally(ClientAlgorithm(model, {"lr": 0.1}), model, TrainData(x, y), steps=1, lr=0.1, batch_size=8, generator=torch.Generator())
    optimizer = torch.optim.SGD(mine.parameters(), lr=0.1)
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(mine(x), y).backward()
    optimizer.step()
    for a, b in zip(model.parameters(), mine.parameters()):
        torch.testing.assert_close(a, b)


def test_short_run_as_recorded_and_a_shared_base_beats_fedavg(short_runs):
    fedper = short_runs("fedper")
    assert_as_recorded("fedper", fedper)
    assert fedper["bmta"] > short_runs("fedavg")["bmta"] + 0.1


def test_the_store_keeps_only_each_clients_head_and_the_base_once():
    """What FedPer keeps per client is its head: 6 of the DNN's 14 values; the base is kept once."""
    server = _server()
    server.plan_training(1, [1, 2])
    server.aggregate(1, [server.check(_reply(1, 1.0, 1)), server.check(_reply(2, 4.0, 3))])
    store = server.method.store
    assert store.dim == 6 and sorted(store.ids()) == [1, 2]
    torch.testing.assert_close(store.get([2]), torch.full((1, 6), 4.0))  # the head only
    state = server.get_state()
    assert state["method"]["store"]["rows"].shape == (2, 6)  # so are checkpoints


def test_a_checkpoint_of_whole_models_resumes_to_the_same_models():
    """Checkpoints written when the store kept whole models restore each client's head."""
    server = _server()
    server.plan_training(1, [1, 2])
    server.aggregate(1, [server.check(_reply(1, 1.0, 1)), server.check(_reply(2, 4.0, 3))])
    state = server.get_state()
    whole = state["method"]["store"]
    whole["rows"] = server.method.stored(whole["ids"])  # (2, 14), as earlier versions saved them
    again = _server()
    again.set_state(state)
    for cid in (1, 2, 3):
        torch.testing.assert_close(again.method.models_for_evaluation([cid]), server.method.models_for_evaluation([cid]))
