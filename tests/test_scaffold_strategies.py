"""SCAFFOLD's strategies (both APIs) and its client, driven without Ray."""

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict
from flwr.common import parameters_to_ndarrays

import fabricate as fb
import strategies
import strategies.message
from client_apps.app import SCAFFOLD_STATE, Node, train
from flower_pfl.config import ExperimentConfig
from flower_pfl.wire import decode_flat, encode_vector

D = 8  # fc.weight (2, 3) + fc.bias (2)


def _arrays(value: float) -> dict[str, np.ndarray]:
    return {"fc.weight": np.full((2, 3), value, np.float32), "fc.bias": np.full(2, value, np.float32)}


def _flat(arrays) -> torch.Tensor:
    return torch.cat([torch.as_tensor(np.asarray(a)).flatten() for a in (arrays.values() if isinstance(arrays, dict) else arrays)])


def _dc(value: float) -> bytes:
    return encode_vector(torch.full((D,), value))


@pytest.fixture(autouse=True)
def _identity():
    fb.set_task_identity()


def test_message_scaffold_two_rounds_by_hand():
    """x += mean Δy; c += |S|/N mean Δc with N the connected nodes; c goes out next round."""
    grid = fb.FakeGrid(range(5))
    strat = strategies.message.SCAFFOLD(fraction_train=0.4, min_train_nodes=2, min_available_nodes=2)
    arrays = ArrayRecord({k: fb.Array(v) for k, v in _arrays(1.0).items()})
    msgs = list(strat.configure_train(1, arrays, ConfigRecord({"lr": 0.1}), grid))
    assert len(msgs) == 2
    assert torch.equal(decode_flat(msgs[0].content["config"]["scaffold-control"], D), torch.zeros(D))
    replies = [fb.train_reply(m, _arrays(1.0 + i), extras={"scaffold-control-delta": _dc(3.0 * i + 1)})
               for i, m in enumerate(msgs)]  # Δy = 0, 1; Δc = 1, 4
    new, metrics = strat.aggregate_train(1, replies)
    assert metrics["clients-accepted"] == 2
    assert torch.allclose(_flat({k: v.numpy() for k, v in new.items()}), torch.full((D,), 1.5))
    msgs = list(strat.configure_train(2, new, ConfigRecord({"lr": 0.1}), grid))
    assert torch.allclose(decode_flat(msgs[0].content["config"]["scaffold-control"], D), torch.full((D,), 2 / 5 * 2.5))


@pytest.mark.parametrize("extras, reason", [(None, "lacks"), ({"scaffold-control-delta": b"\x00" * 12}, "expected 8"),
                                            ({"scaffold-control-delta": encode_vector(torch.full((D,), float("nan")))}, "NaN")])
def test_message_scaffold_rejects_a_bad_control_delta(extras, reason, caplog):
    grid = fb.FakeGrid(range(2))
    strat = strategies.message.SCAFFOLD(fraction_train=1.0, min_train_nodes=2, min_available_nodes=2)
    msgs = list(strat.configure_train(1, ArrayRecord({k: fb.Array(v) for k, v in _arrays(0.0).items()}), ConfigRecord(), grid))
    good = fb.train_reply(msgs[0], _arrays(2.0), extras={"scaffold-control-delta": _dc(1.0)})
    bad = fb.train_reply(msgs[1], _arrays(9.0), extras=extras)
    new, metrics = strat.aggregate_train(1, [good, bad])
    assert metrics["clients-accepted"] == 1 and metrics["clients-rejected"] == 1
    assert torch.allclose(_flat({k: v.numpy() for k, v in new.items()}), torch.full((D,), 2.0))  # only the good one
    assert torch.allclose(strat.server.control, torch.full((D,), 0.5))  # |S| / N = 1 / 2
    assert reason in caplog.text


def test_legacy_scaffold_round():
    cm = fb.client_manager(["a", "b", "c", "d"])
    strat = strategies.SCAFFOLD(initial_parameters=fb.parameters(list(_arrays(0.0).values())), fraction_fit=0.5,
                                min_fit_clients=2, min_available_clients=2, server_learning_rate=0.5)
    ins = strat.configure_fit(1, strat.initial_parameters, cm)
    assert len(ins) == 2 and all(len(fi.config["scaffold-control"]) == 4 * D for _, fi in ins)
    res = [(p, fb.fit_res(list(_arrays(2.0 * (i + 1)).values()), extras={"scaffold-control-delta": _dc(i + 1.0)}))
           for i, (p, _) in enumerate(ins)]
    params, metrics = strat.aggregate_fit(1, res, [])
    assert torch.allclose(_flat(parameters_to_ndarrays(params)), torch.full((D,), 0.5 * 3.0))  # η_g mean Δy
    assert torch.allclose(strat.server.control, torch.full((D,), 2 / 4 * 1.5))
    assert "scaffold-control-delta" not in metrics  # bytes never reach the metrics


def test_client_keeps_its_control_variate_and_returns_the_change():
    state = RecordDict()
    context = Context(run_id=1, node_id=3, node_config={"partition-id": 0, "num-partitions": 4}, state=state,
                      run_config=ExperimentConfig().to_run_config())
    node = Node.from_context(context)
    dim = sum(p.numel() for p in node.model.parameters())
    config = {"lr": 0.05, "local-steps": 3, "batch-size": 10, "server-round": 1, "scaffold-control": encode_vector(torch.full((dim,), 0.1))}
    _, payload = node.fit(config)
    first = _flat(state[SCAFFOLD_STATE].to_numpy_ndarrays())
    assert torch.allclose(decode_flat(payload["scaffold-control-delta"], dim), first)  # c_i was zero: Δc_i = c_i^+
    _, payload = Node.from_context(context).fit({**config, "server-round": 2})
    second = _flat(state[SCAFFOLD_STATE].to_numpy_ndarrays())
    assert torch.allclose(decode_flat(payload["scaffold-control-delta"], dim), second - first, atol=1e-6)


def test_message_clientapp_reply_carries_the_control_delta():
    context = Context(run_id=1, node_id=3, node_config={"partition-id": 1, "num-partitions": 4}, state=RecordDict(),
                      run_config=ExperimentConfig().to_run_config())
    node = Node.from_context(context)
    dim = sum(p.numel() for p in node.model.parameters())
    arrays = ArrayRecord({k: fb.Array(v.numpy()) for k, v in node.model.state_dict().items()})
    config = ConfigRecord({"lr": 0.05, "local-steps": 2, "batch-size": 10, "scaffold-control": encode_vector(torch.zeros(dim))})
    msg = fb.Message(RecordDict({"arrays": arrays, "config": config}), message_type="train", dst_node_id=3)
    reply = train(msg, context)
    assert decode_flat(reply.content["payload"]["scaffold-control-delta"], dim).shape == (dim,)
