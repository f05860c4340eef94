"""The legacy and Message-API twins of every method come from one declaration and cannot drift:
driven with the same client replies, they send the same models and settings to the same clients
and end with the same server state."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from typing import Any

import fabricate as fb
import numpy as np
import pytest
import torch
from flwr.common import parameters_to_ndarrays

import strategies
import strategies.message
from flower_pfl.engine.client_algorithm import BATCH_SIZE, LOCAL_STEPS, LR, SERVER_ROUND, TrainData, train_locally
from flower_pfl.engine.layout import ParamLayout
from flower_pfl.experiment.config import ExperimentConfig
from flower_pfl.experiment.models import DNN
from flower_pfl.methods.registry import client_algorithm_for, entries

NODES = [11, 12, 13, 14, 15]
TRAINING = {LR: 0.05, LOCAL_STEPS: 3, BATCH_SIZE: 4}
OURS = [e for e in entries() if not e.builtin]


def _model(bn: bool = False) -> torch.nn.Module:
    """The twins' DNN; ``bn``: with batch normalization (for a method that needs it, FedBN)."""
    torch.manual_seed(0)
    return DNN(6, 3, hidden=4, batch_norm=bn)


_needs_bn = fb.needs_bn
#: how many tensors the batch-normalized twin DNN has (fc1, bn1's weight, bias and three statistics, fc2)
BN_TENSORS = 9


def _data(node: int) -> TrainData:
    g = torch.Generator().manual_seed(node)
    x = torch.randn(12, 6, generator=g)
    return TrainData(x, (x[:, node % 6] > 0).long() + (x[:, 0] > 1).long())


class Clients:
    """Real client algorithms on tiny data, one state per node: the same replies for both twins."""

    def __init__(self) -> None:
        self.states: dict[int, dict] = {n: {} for n in NODES}

    def train(self, node: int, arrays: list[np.ndarray], config: dict) -> tuple[list[np.ndarray], int, dict]:
        model = _model(bn=len(arrays) == BN_TENSORS)  # the DNN the arrays are of
        with torch.no_grad():
            for p, a in zip(model.state_dict().values(), arrays):
                p.copy_(torch.as_tensor(a))
        step = client_algorithm_for(config)(model, config, self.states[node])
        _, extras = train_locally(step, model, _data(node), steps=int(config[LOCAL_STEPS]), lr=float(config[LR]),
                                  batch_size=int(config[BATCH_SIZE]), generator=torch.Generator().manual_seed(node))
        return [t.detach().numpy().copy() for t in model.state_dict().values()], 10 + node, extras


def _twins(entry, **options):
    bn = _needs_bn(entry)
    cfg = ExperimentConfig(method=entry.method, aggregation=entry.aggregation, clients_per_round=3, model="dnn-bn" if bn else "dnn",
                           options=options)
    args = cfg.method_arguments()
    initial = {k: v.numpy() for k, v in _model(bn).state_dict().items()}
    legacy = getattr(strategies, entry.strategy)(**args, initial_parameters=initial, clients_per_round=3, min_available_clients=1,
                                                  on_fit_config_fn=lambda _: dict(TRAINING), seed=7)
    message = getattr(strategies.message, entry.strategy)(**args, clients_per_round=3, min_available_nodes=1, seed=7)
    return legacy, message, initial


def _same_config(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        assert a[key] == b[key], key


def _run_rounds(legacy, message, initial, rounds: int = 3):
    """Drive both twins; return what each sent per round, and assert sameness along the way."""
    from flwr.app import ArrayRecord, ConfigRecord

    fb.set_task_identity()
    cm, grid = fb.client_manager([str(n) for n in NODES]), fb.FakeGrid(NODES)
    arrays, params = ArrayRecord({k: torch.as_tensor(v) for k, v in initial.items()}), legacy.initial_parameters
    clients_l, clients_m = Clients(), Clients()
    names = list(initial)
    for rnd in range(1, rounds + 1):
        fit = legacy.configure_fit(rnd, params, cm)
        msgs = list(message.configure_train(rnd, arrays, ConfigRecord(dict(TRAINING)), grid))
        assert [int(p.cid) for p, _ in fit] == [m.metadata.dst_node_id for m in msgs]
        results, replies = [], []
        for (proxy, ins), msg in zip(fit, msgs):
            sent_l = parameters_to_ndarrays(ins.parameters)
            sent_m = msg.content["arrays"]
            assert list(sent_m.keys()) == names
            for a, b in zip(sent_l, sent_m.values()):
                np.testing.assert_array_equal(a, b.numpy())
            _same_config(dict(ins.config), dict(msg.content["config"]))
            assert ins.config[SERVER_ROUND] == rnd
            trained, n, extras = clients_l.train(int(proxy.cid), sent_l, dict(ins.config))
            results.append((proxy, fb.fit_res(trained, n, extras)))
            trained_m, n_m, extras_m = clients_m.train(msg.metadata.dst_node_id, [b.numpy() for b in sent_m.values()],
                                                       dict(msg.content["config"]))
            replies.append(fb.train_reply(msg, dict(zip(names, trained_m)), n_m, extras=extras_m or None))
        new_params, metrics_l = legacy.aggregate_fit(rnd, results, [])
        new_arrays, metrics_m = message.aggregate_train(rnd, replies)
        assert metrics_l["clients-accepted"] == metrics_m["clients-accepted"] == len(fit)
        if new_params is not None:
            params, arrays = new_params, new_arrays
        ev_l = legacy.configure_evaluate(rnd, params, cm)
        ev_m = list(message.configure_evaluate(rnd, arrays, ConfigRecord({}), grid))
        assert [int(p.cid) for p, _ in ev_l] == [m.metadata.dst_node_id for m in ev_m] == NODES
        for (_, ins), msg in zip(ev_l, ev_m):
            for a, b in zip(parameters_to_ndarrays(ins.parameters), msg.content["arrays"].values()):
                np.testing.assert_array_equal(a, b.numpy())
            _same_config(dict(ins.config), dict(msg.content["config"]))


def _leaves(value: Any, path: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    """``(path, leaf)`` for every tensor, array and plain value of a nested state."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield from _leaves(item, (*path, key))
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _leaves(item, (*path, i))
    else:
        yield path, value


def _assert_same_state(legacy, message) -> None:
    """Every part of the two servers' state, exactly: what a checkpoint holds (the sampler, the last
    participants, every state attribute of the method, every client's model) and what the results
    save (``server_state``)."""
    for a, b in ((legacy.server.get_state(), message.server.get_state()),
                 (legacy.method.server_state(), message.method.server_state())):
        la, lb = dict(_leaves(a)), dict(_leaves(b))
        assert la.keys() == lb.keys()
        for path, x in la.items():
            y, where = lb[path], ".".join(map(str, path))
            if isinstance(x, (torch.Tensor, np.ndarray)):
                assert type(x) is type(y) and x.dtype == y.dtype and x.shape == y.shape, where
                torch.testing.assert_close(torch.as_tensor(x), torch.as_tensor(y), rtol=0, atol=0, equal_nan=True, msg=where)
            else:
                assert x == y, (where, x, y)


@pytest.mark.parametrize("entry", OURS, ids=[e.label for e in OURS])
def test_twins_send_the_same_models_and_keep_the_same_state(entry):
    legacy, message, initial = _twins(entry)
    _run_rounds(legacy, message, initial)
    _assert_same_state(legacy, message)


@pytest.mark.parametrize("options", [{"all-clients-train": True, "layer-grouping": "module"}, {"layer-grouping": "module"}])
def test_fedmcsa_twins_agree_with_module_components_and_all_clients_training(options):
    entry = next(e for e in OURS if e.label == "fedmcsa")
    legacy, message, initial = _twins(entry, **options)
    _run_rounds(legacy, message, initial)
    _assert_same_state(legacy, message)
    components = [name for name, _ in legacy.server.layout.components("module")]
    assert components == [name for name, _ in message.server.layout.components("module")] == ["fc1", "fc2"]
    assert sorted(legacy.method.attention_weights.mean()[1]) == ["fc1", "fc2"]


def test_fedattn_twins_personalize_the_same_tensors_as_the_client():
    entry = next(e for e in OURS if e.label == "fedattn")
    legacy, message, initial = _twins(entry)
    layout = ParamLayout.from_arrays(initial)
    expected = torch.cat([torch.full((int(np.prod(s)),), n.endswith("bias")) for n, s in zip(layout.names, layout.shapes)])
    _run_rounds(legacy, message, initial, rounds=2)
    assert torch.equal(legacy.method.mask, expected) and torch.equal(message.method.mask, expected)
    assert legacy.method.biases.keys() == message.method.biases.keys() and len(legacy.method.biases) >= 3


def test_a_strategy_without_parameter_names_says_so_for_fedattn():
    from flwr.common import ndarrays_to_parameters

    with pytest.raises(ValueError, match="named '\\*bias'"):
        strategies.FedAttn(initial_parameters=ndarrays_to_parameters([v.numpy() for v in _model().state_dict().values()]))


def _numeric(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.numel() > 0
    if isinstance(value, np.ndarray):
        return value.size > 0
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _perturbed(state: Any, path: tuple) -> Any:
    """A copy of ``state`` with the number(s) at ``path`` changed by 1e3 (ids stay distinct)."""
    if not path:
        return state + (np.asarray(1000, dtype=state.dtype) if isinstance(state, np.ndarray) else 1000)
    key, rest = path[0], path[1:]
    if isinstance(state, Mapping):
        return {k: _perturbed(v, rest) if k == key else copy.deepcopy(v) for k, v in state.items()}
    items = [_perturbed(v, rest) if i == key else copy.deepcopy(v) for i, v in enumerate(state)]
    return type(state)(items)


@pytest.mark.parametrize("entry", OURS, ids=[e.label for e in OURS])
def test_a_change_to_any_part_of_a_servers_state_is_caught(entry):
    """The comparison the twins and the hostile-reply cases rely on sees every part of the state: each
    number in it changed on its own (the method's own state too: SCAFFOLD's control variate, IGFL's
    global delta, FedPer's base, FedAttn's biases, ...) makes the twins differ."""
    legacy, message, initial = _twins(entry)
    _run_rounds(legacy, message, initial, rounds=2)
    original = copy.deepcopy(message.server.get_state())
    paths = [path for path, value in _leaves(original) if _numeric(value)]
    assert any(path[0] == "method" and path[1] != "attention_weights" for path in paths), paths
    _assert_same_state(legacy, copy.deepcopy(message))  # a copy alone changes nothing
    for path in paths:
        changed = copy.deepcopy(message)
        changed.server.set_state(_perturbed(original, path))
        with pytest.raises(AssertionError):
            _assert_same_state(legacy, changed)
