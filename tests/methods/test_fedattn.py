"""FedAttn (Luo, Panchal, Guan): neighbour search, the attention and its gradient, the client algorithm
(in the package's loop and in a user's own), the server through both Flower APIs, one whole run."""

import copy
import math

import fabricate as fb
import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord
from flwr.common import parameters_to_ndarrays

import flower_pfl.methods.fedattn as fa
import strategies
import strategies.message
from client_apps.own_loop import algorithm_for
from flower_pfl.engine.client_algorithm import CLIENT_ALGORITHM, LR, TrainData, train_locally
from flower_pfl.engine.layout import ParamLayout
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.engine.minibatches import MinibatchStream
from flower_pfl.engine.model_split import mean_features
from flower_pfl.engine.reply_checks import RawReply, UpdateRejected
from flower_pfl.engine.wire import decode_flat, encode_vector
from flower_pfl.experiment.models import DNN, MLR
from flower_pfl.run.results import SERVER_STATE, load_state

from .runs import assert_as_recorded

F = torch.nn.functional


# --- the math ------------------------------------------------------------------------------------

def test_nearest_neighbours_match_brute_force(monkeypatch):
    g = torch.Generator().manual_seed(0)
    points, queries = torch.randn(50, 4, generator=g), torch.randn(7, 4, generator=g)
    brute = [sorted(range(50), key=lambda j: float(((points[j] - q) ** 2).sum()))[:5] for q in queries]
    assert fa.nearest_neighbours(points, queries, 5).tolist() == brute
    assert fa.nearest_neighbours(points, points[:3], 1).tolist() == [[0], [1], [2]]  # a point is its own nearest
    assert fa.nearest_neighbours(points[:2], queries, 5).shape == (7, 2)  # k is capped at the points there are


def test_faiss_exact_index_gives_the_brute_force_neighbours(monkeypatch):
    """The ``faiss`` extra (installed with ``dev``): FAISS's exact index, used above ``FAISS_MIN_WORK``."""
    pytest.importorskip("faiss", reason="the faiss extra is not installed")
    g = torch.Generator().manual_seed(0)
    points, queries = torch.randn(50, 4, generator=g), torch.randn(7, 4, generator=g)
    monkeypatch.setattr(fa, "FAISS_MIN_WORK", float("inf"))
    brute = fa.nearest_neighbours(points, queries, 5).tolist()  # torch's exact distances
    monkeypatch.setattr(fa, "FAISS_MIN_WORK", 0)
    assert fa.nearest_neighbours(points, queries, 5).tolist() == brute


def test_bias_mask_by_name_and_a_model_without_named_biases_is_refused():
    named = ParamLayout(names=("fc.weight", "fc.bias"), shapes=((2, 3), (2,)))
    assert fa.bias_mask(named).tolist() == [False] * 6 + [True] * 2
    unnamed = ParamLayout(names=("0", "1"), shapes=((2, 3), (2,)))  # legacy Flower Parameters carry no names
    assert not fa.bias_mask(unnamed).any()
    server = MethodServer(fa.FedAttn(), clients_per_round=2)
    with pytest.raises(ValueError, match="has none"):
        server.initialize({"0": np.zeros((2, 3), np.float32), "1": np.zeros(2, np.float32)})


def test_with_one_neighbour_a_client_gets_its_own_biases_through_w_v():
    module = fa.BiasAttention(d_z=3, d_bias=4, d_k=2, generator=torch.Generator().manual_seed(1))
    z, own = torch.randn(1, 3), torch.randn(1, 1, 4)
    out, weights = module(z, z[:, None], own)
    assert torch.allclose(weights, torch.ones(1, 1)) and torch.allclose(out, own[:, 0])  # W_V starts as I
    with torch.no_grad():
        module.w_v.mul_(2.0)
    assert torch.allclose(module(z, z[:, None], own)[0], 2 * own[:, 0])


def _attention_by_hand(module: fa.BiasAttention, z: torch.Tensor, z_n: torch.Tensor, m_n: torch.Tensor) -> torch.Tensor:
    """Def. 3.1 for one client: softmax((Z_N W_K)(Z_i W_Q)ᵀ / √d_k) (M_N W_V)."""
    with torch.no_grad():
        scores = (z_n @ module.w_k) @ (z @ module.w_q) / math.sqrt(module.d_k)
        return torch.softmax(scores, dim=0) @ (m_n @ module.w_v)


def test_attention_is_definition_3_1():
    g = torch.Generator().manual_seed(5)
    module = fa.BiasAttention(d_z=3, d_bias=2, d_k=4, generator=g)
    with torch.no_grad():
        module.w_v.add_(0.5 * torch.randn(2, 2, generator=g))
    z, keys, values = torch.randn(2, 3, generator=g), torch.randn(2, 5, 3, generator=g), torch.randn(2, 5, 2, generator=g)
    out, weights = module(z, keys, values)
    for i in range(2):
        assert torch.allclose(out[i], _attention_by_hand(module, z[i], keys[i], values[i]), atol=1e-6)
    assert torch.allclose(weights.sum(1), torch.ones(2)) and (weights > 0).all()


def test_attention_step_follows_the_chain_algorithm_by_finite_differences():
    """The client reports ∂f/∂M̃ for f(M̃) = ½||M̃ − t||²; the step must be −lr ∂f(M̃(W))/∂W."""
    torch.set_default_dtype(torch.float64)
    try:
        g = torch.Generator().manual_seed(3)
        module = fa.BiasAttention(d_z=3, d_bias=2, d_k=2, generator=g)
        with torch.no_grad():
            module.w_v.add_(0.3 * torch.randn(2, 2, generator=g))
        q, keys, values = torch.randn(2, 3, generator=g), torch.randn(2, 3, 3, generator=g), torch.randn(2, 3, 2, generator=g)
        target = torch.randn(2, 2, generator=g)

        def f() -> float:
            with torch.no_grad():
                return float(0.5 * ((module(q, keys, values)[0] - target) ** 2).sum())

        numeric = []
        for p in module.parameters():
            grad = torch.zeros_like(p)
            for i in range(p.numel()):
                with torch.no_grad():
                    p.view(-1)[i] += 1e-6
                    up = f()
                    p.view(-1)[i] -= 2e-6
                    down = f()
                    p.view(-1)[i] += 1e-6
                grad.view(-1)[i] = (up - down) / 2e-6
            numeric.append(grad)
        before = [p.detach().clone() for p in module.parameters()]
        with torch.no_grad():
            reported = module(q, keys, values)[0] - target  # what the clients send back
        fa.attention_step(module, torch.optim.SGD(module.parameters(), lr=0.1), q, keys, values, reported)
        for b, p, n in zip(before, module.parameters(), numeric):
            assert torch.allclose((b - p.detach()) / 0.1, n, atol=1e-6)
            assert n.abs().sum() > 0
    finally:
        torch.set_default_dtype(torch.float32)


def test_fixed_values_keep_w_v_the_identity_and_the_output_a_convex_mix():
    g = torch.Generator().manual_seed(4)
    module = fa.BiasAttention(d_z=3, d_bias=2, d_k=2, generator=g, learn_values=False)
    q, keys, values = torch.randn(2, 3, generator=g), torch.randn(2, 4, 3, generator=g), torch.randn(2, 4, 2, generator=g)
    opt = torch.optim.SGD([p for p in module.parameters() if p.requires_grad], lr=1.0)
    w_q = module.w_q.detach().clone()
    fa.attention_step(module, opt, q, keys, values, torch.randn(2, 2, generator=g) * 100)
    assert torch.equal(module.w_v, torch.eye(2)) and not torch.equal(module.w_q, w_q)
    out, _ = module(q, keys, values)
    assert torch.all(out <= values.max(1).values + 1e-6) and torch.all(out >= values.min(1).values - 1e-6)


def test_representation_is_the_mean_input_of_the_last_layer():
    x = torch.randn(30, 5, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    dnn = DNN(5, 3, hidden=4)
    assert torch.allclose(mean_features(dnn, x, batch_size=7), torch.relu(dnn.fc1(x)).mean(0), atol=1e-6)
    assert torch.allclose(mean_features(MLR(5, 3), x), x.mean(0), atol=1e-6)  # one layer: the input


# --- the client algorithm -----------------------------------------------------------------------------

def _data():
    x = torch.randn(40, 5, generator=torch.Generator().manual_seed(2))
    return x, (x[:, 0] > 0).long()


def _dnn() -> DNN:
    torch.manual_seed(0)
    return DNN(5, 3, hidden=4)


def _config(bias_reg: float = 0.0, global_biases: torch.Tensor | None = None) -> dict:
    config = {CLIENT_ALGORITHM: "fedattn", LR: 0.1, fa.BIAS_REG: bias_reg}
    if global_biases is not None:
        config[fa.GLOBAL_BIASES] = encode_vector(global_biases)
    return config


def _train(model, config, steps, seed=9):
    x, y = _data()
    return train_locally(fa.FedAttnClient(model, config), model, TrainData(x, y), steps=steps, lr=0.1, batch_size=8,
                         generator=torch.Generator().manual_seed(seed))


def test_one_step_reports_the_bias_gradient_and_the_regularizer_pulls_to_the_global_biases():
    x, y = _data()
    model = _dnn()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    idx = MinibatchStream(40, 8, torch.Generator().manual_seed(9)).next()
    loss = F.cross_entropy(model(x[idx]), y[idx])
    expected = torch.cat([g.flatten() for g in torch.autograd.grad(loss, [model.fc1.bias, model.fc2.bias])])
    _, extras = _train(model, _config(), steps=1)
    z, grad = decode_flat(extras[fa.REPRESENTATION], 4), decode_flat(extras[fa.BIAS_GRADIENT], 7)
    assert torch.allclose(grad, expected, atol=1e-6)
    assert torch.allclose(z, mean_features(model, x), atol=1e-6)  # Z_i of the trained model

    model.load_state_dict(start)
    _, extras = _train(model, _config(2.0, torch.full((7,), 5.0)), steps=1)
    with_reg = decode_flat(extras[fa.BIAS_GRADIENT], 7)
    pull = 2.0 * (torch.cat([start["fc1.bias"], start["fc2.bias"]]) - 5.0)  # ∂/∂b of reg/2 ||b − b_G||²
    assert torch.allclose(with_reg - expected, pull, atol=1e-5) and pull.abs().min() > 0
    # the weights are not regularized
    model.load_state_dict(start)
    _train(model, _config(), steps=1)
    w_plain = model.fc1.weight.detach().clone()
    model.load_state_dict(start)
    _train(model, _config(2.0, torch.full((7,), 5.0)), steps=1)
    assert torch.allclose(model.fc1.weight, w_plain) and not torch.allclose(model.fc1.bias, start["fc1.bias"])


def test_several_steps_report_the_mean_bias_gradient():
    model = _dnn()
    received = torch.cat([model.fc1.bias.detach().clone(), model.fc2.bias.detach().clone()])
    _, extras = _train(model, _config(), steps=4)
    trained = torch.cat([model.fc1.bias.detach(), model.fc2.bias.detach()])
    assert torch.allclose(decode_flat(extras[fa.BIAS_GRADIENT], 7), (received - trained) / (0.1 * 4), atol=1e-6)


def test_the_step_in_a_users_own_loop_gives_what_train_locally_gives():
    x, y = _data()
    config = _config(0.5, torch.linspace(-1, 1, 7))
    reference = _dnn()
    _, expected = _train(reference, config, steps=5, seed=3)

    model = _dnn()
    optimizer = torch.optim.SGD(model.parameters(), lr=config[LR])
    step = algorithm_for(config, model, None, optimizer)
    assert isinstance(step, fa.FedAttnClient)
    stream = MinibatchStream(40, 8, torch.Generator().manual_seed(3))
    model.train()
    for _ in range(5):
        idx = stream.next()
        optimizer.zero_grad()
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        step.adjust_gradients(model, (x[idx], y[idx]))
        optimizer.step()
    extras = step.finish(model, x)
    for p, r in zip(model.parameters(), reference.parameters()):
        assert torch.allclose(p, r, atol=1e-6)
    assert extras.keys() == expected.keys() == {fa.REPRESENTATION, fa.BIAS_GRADIENT, CLIENT_ALGORITHM}
    assert extras[CLIENT_ALGORITHM] == expected[CLIENT_ALGORITHM] == "fedattn"
    assert torch.allclose(decode_flat(extras[fa.REPRESENTATION], 4), decode_flat(expected[fa.REPRESENTATION], 4), atol=1e-6)
    assert torch.allclose(decode_flat(extras[fa.BIAS_GRADIENT], 7), decode_flat(expected[fa.BIAS_GRADIENT], 7), atol=1e-5)
    # finish also takes the training batches instead of one tensor
    batches = step.finish(model, [(x[:20], y[:20]), (x[20:], y[20:])])
    assert torch.allclose(decode_flat(batches[fa.REPRESENTATION], 4), decode_flat(extras[fa.REPRESENTATION], 4), atol=1e-6)


def test_the_step_refuses_what_its_arithmetic_cannot_use():
    model = _dnn()
    with pytest.raises(ValueError, match="momentum"):
        algorithm_for(_config(), model, None, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    with pytest.raises(ValueError, match="step size"):
        algorithm_for(_config(), model, None, torch.optim.SGD(model.parameters(), lr=0.2))
    with pytest.raises(ValueError, match="fedattn-global-biases"):
        fa.FedAttnClient(model, _config(0.5))  # a regularizer toward biases it was not sent
    step = fa.FedAttnClient(model, _config())
    with pytest.raises(ValueError, match="at least one step"):
        step.finish(model, _data()[0])
    step.adjust_gradients(model)
    with pytest.raises(ValueError, match="inputs"):
        step.finish(model)


# --- the server ----------------------------------------------------------------------------------

def _arrays(w: float, b: list[float]) -> dict[str, np.ndarray]:
    return {"fc.weight": np.full((2, 2), w, np.float32), "fc.bias": np.array(b, np.float32)}


def _extras(z, grad=(0.0, 0.0)) -> dict:
    return {fa.REPRESENTATION: encode_vector(torch.tensor(z)), fa.BIAS_GRADIENT: encode_vector(torch.tensor(grad))}


def _reply(msg, arrays, z, grad=(0.0, 0.0), n=10):
    return fb.train_reply(msg, arrays, num_examples=n, extras=_extras(z, grad))


@pytest.fixture
def _identity():
    fb.set_task_identity()


def test_server_round_trip_fedavg_then_each_client_its_own_biases(_identity):
    grid = fb.FakeGrid([1, 2])
    strat = strategies.message.FedAttn(k=1, fraction_train=1.0, min_train_nodes=2, min_available_nodes=2)
    arrays = ArrayRecord({k: fb.Array(v) for k, v in _arrays(0.0, [0.0, 0.0]).items()})
    msgs = list(strat.configure_train(1, arrays, ConfigRecord({"lr": 0.1}), grid))
    assert all(m.content["config"][CLIENT_ALGORITHM] == "fedattn" for m in msgs)
    assert all(np.array_equal(m.content["arrays"]["fc.bias"].numpy(), [0.0, 0.0]) for m in msgs)  # no Z yet: global
    returned = {1: _arrays(1.0, [1.0, 2.0]), 2: _arrays(4.0, [3.0, 4.0])}
    new, metrics = strat.aggregate_train(1, [_reply(m, returned[m.metadata.dst_node_id], [float(m.metadata.dst_node_id), 0.0],
                                                    n=10 * m.metadata.dst_node_id) for m in msgs])
    assert metrics["clients-accepted"] == 2
    assert np.allclose(new["fc.weight"].numpy(), (1.0 * 10 + 4.0 * 20) / 30)  # FedAvg, weighted by samples
    for m in strat.configure_evaluate(1, new, ConfigRecord(), grid):  # evaluated: the new G with the client's biases
        assert np.allclose(m.content["arrays"]["fc.weight"].numpy(), new["fc.weight"].numpy())
        assert np.allclose(m.content["arrays"]["fc.bias"].numpy(), returned[m.metadata.dst_node_id]["fc.bias"])
    msgs = list(strat.configure_train(2, new, ConfigRecord({"lr": 0.1}), grid))
    for m in msgs:  # G's weights with the client's own biases (k = 1, W_V = I)
        nid = m.metadata.dst_node_id
        assert np.allclose(m.content["arrays"]["fc.weight"].numpy(), new["fc.weight"].numpy())
        assert np.allclose(m.content["arrays"]["fc.bias"].numpy(), returned[nid]["fc.bias"])
    evals = list(strat.configure_evaluate(2, new, ConfigRecord(), grid))
    assert all(np.allclose(m.content["arrays"]["fc.bias"].numpy(), returned[m.metadata.dst_node_id]["fc.bias"]) for m in evals)
    w_v = strat.method.module.w_v.detach().clone()
    strat.aggregate_train(2, [_reply(m, returned[m.metadata.dst_node_id], [1.0, 0.0], grad=[1.0, -1.0]) for m in msgs])
    assert not torch.equal(strat.method.module.w_v, w_v)  # the reported gradients trained the attention


def test_server_sends_the_attention_over_the_k_nearest_and_steps_it_with_the_reported_gradients():
    """Driven through MethodServer: three clients, k = 2; client i's biases are the attention
    over itself and its nearest other client (Def. 3.1), and the next aggregation takes one
    attention step on exactly the personalized clients' reported gradients."""
    method = fa.FedAttn(k=2, d_k=3, attention_lr=0.5)
    server = MethodServer(method, clients_per_round=3, seed=0)
    server.initialize(_arrays(0.0, [0.0, 0.0]))
    z = {1: [0.0, 0.0], 2: [1.0, 0.0], 3: [5.0, 5.0]}
    biases = {1: [1.0, 2.0], 2: [3.0, -1.0], 3: [-2.0, 0.5]}

    def reply(cid, grad=(0.0, 0.0)):
        return server.check(RawReply(cid, list(_arrays(float(cid), biases[cid]).values()), ["fc.weight", "fc.bias"], 10, {},
                                     _extras(z[cid], grad)))

    plan = server.plan_training(1, [1, 2, 3])
    assert all(torch.equal(ins.model, torch.zeros(6)) for ins in plan)
    server.aggregate(1, [reply(cid) for cid in (1, 2, 3)])
    module = copy.deepcopy(method.module)
    plan = {ins.client_id: ins.model for ins in server.plan_training(2, [1, 2, 3])}
    nearest = {1: [1, 2], 2: [2, 1], 3: [3, 2]}
    for cid, ids in nearest.items():
        by_hand = _attention_by_hand(module, torch.tensor(z[cid]), torch.tensor([z[j] for j in ids]),
                                     torch.tensor([biases[j] for j in ids]))
        assert torch.allclose(plan[cid][4:], by_hand, atol=1e-6)
        assert torch.allclose(plan[cid][:4], torch.full((4,), 2.0))  # G: the mean of the weights 1, 2, 3
    grads = {1: [1.0, -1.0], 2: [0.5, 2.0], 3: [-3.0, 1.0]}
    server.aggregate(2, [reply(cid, grads[cid]) for cid in (1, 3)])  # client 2's reply is lost
    expected = copy.deepcopy(module)
    sent = [1, 3]
    fa.attention_step(expected, torch.optim.SGD(expected.parameters(), lr=0.5), torch.tensor([z[c] for c in sent]),
                      torch.tensor([[z[j] for j in nearest[c]] for c in sent]),
                      torch.tensor([[biases[j] for j in nearest[c]] for c in sent]), torch.tensor([grads[c] for c in sent]))
    for p, e, before in zip(method.module.parameters(), expected.parameters(), module.parameters()):
        assert torch.allclose(p, e, atol=1e-6) and not torch.allclose(p, before)


def test_neighbours_are_found_among_the_representations_of_the_last_round():
    """The representations are stacked once per round, for all clients: after client 3 moves next to
    client 1, client 1 attends over client 3 (and the stack holds every client's latest Z_i)."""
    method = fa.FedAttn(k=2, d_k=3)
    server = MethodServer(method, clients_per_round=3, seed=0)
    server.initialize(_arrays(0.0, [0.0, 0.0]))

    def round_(r, z):
        server.plan_training(r, [1, 2, 3])
        server.aggregate(r, [server.check(RawReply(cid, list(_arrays(1.0, [float(cid), 0.0]).values()), ["fc.weight", "fc.bias"],
                                                   10, {}, _extras(z[cid]))) for cid in (1, 2, 3)])

    round_(1, {1: [0.0, 0.0], 2: [1.0, 0.0], 3: [5.0, 5.0]})
    assert method.personalized_biases([1])[1][1].values[0, :, 0].tolist() == [1.0, 2.0]  # itself and client 2
    round_(2, {1: [0.0, 0.0], 2: [1.0, 0.0], 3: [0.1, 0.0]})
    known, points = method.known_points()
    assert known == [1, 2, 3] and torch.equal(points, torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.1, 0.0]]))
    assert method.personalized_biases([1])[1][1].values[0, :, 0].tolist() == [1.0, 3.0]  # itself and client 3, now nearer
    together, alone = method.client_models([3, 1, 2, 4], False), [method.client_model(c, False) for c in (3, 1, 2, 4)]
    assert together[3] is None and alone[3] is None  # client 4 has no representation: the global model
    for a, b in zip(together[:3], alone[:3]):  # one attention pass for all, or one per client
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_warmup_sends_the_global_model_and_the_regularizer_sends_the_global_biases(_identity):
    grid = fb.FakeGrid([1, 2])
    strat = strategies.message.FedAttn(k=1, warmup_rounds=2, bias_reg=0.5, fraction_train=1.0, min_train_nodes=2,
                                       min_available_nodes=2)
    arrays = ArrayRecord({k: fb.Array(v) for k, v in _arrays(0.0, [7.0, 8.0]).items()})
    for rnd in (1, 2):
        msgs = list(strat.configure_train(rnd, arrays, ConfigRecord(), grid))
        assert all(np.array_equal(m.content["arrays"]["fc.bias"].numpy(), arrays["fc.bias"].numpy()) for m in msgs)
        assert all(m.content["config"][fa.BIAS_REG] == 0.5 for m in msgs)
        assert torch.equal(decode_flat(msgs[0].content["config"][fa.GLOBAL_BIASES], 2), torch.tensor(arrays["fc.bias"].numpy()))
        arrays, _ = strat.aggregate_train(rnd, [_reply(m, _arrays(1.0, [float(m.metadata.dst_node_id)] * 2),
                                                       [float(m.metadata.dst_node_id), 2.0]) for m in msgs])
    msgs = list(strat.configure_train(3, arrays, ConfigRecord(), grid))
    for m in msgs:  # personalized now: each client's own biases
        assert m.content["arrays"]["fc.bias"].numpy().tolist() == [float(m.metadata.dst_node_id)] * 2


@pytest.mark.parametrize("extras, reason", [({fa.REPRESENTATION: encode_vector(torch.ones(2))}, "lacks"),
                                            ({fa.REPRESENTATION: encode_vector(torch.ones(2)), fa.BIAS_GRADIENT: b"\x00" * 4}, "expected 2"),
                                            ({fa.REPRESENTATION: encode_vector(torch.ones(3)), fa.BIAS_GRADIENT: encode_vector(torch.ones(2))},
                                             "expected 2"),
                                            ({fa.REPRESENTATION: encode_vector(torch.tensor([np.nan, 0.0])),
                                              fa.BIAS_GRADIENT: encode_vector(torch.ones(2))}, "NaN")])
def test_server_rejects_bad_fedattn_extras(extras, reason, caplog, _identity):
    grid = fb.FakeGrid([1, 2])
    strat = strategies.message.FedAttn(fraction_train=1.0, min_train_nodes=2, min_available_nodes=2)
    msgs = list(strat.configure_train(1, ArrayRecord({k: fb.Array(v) for k, v in _arrays(0.0, [0.0, 0.0]).items()}), ConfigRecord(), grid))
    good = _reply(msgs[0], _arrays(1.0, [1.0, 1.0]), [1.0, 2.0])
    bad = fb.train_reply(msgs[1], _arrays(9.0, [9.0, 9.0]), extras=extras)
    new, metrics = strat.aggregate_train(1, [good, bad])
    assert metrics["clients-rejected"] == 1 and np.allclose(new["fc.weight"].numpy(), 1.0)
    assert reason in caplog.text
    with pytest.raises(UpdateRejected, match=reason):  # the same check, straight on the server
        strat.server.check(RawReply(2, list(_arrays(9.0, [9.0, 9.0]).values()), None, 10, {}, extras))


def test_legacy_fedattn_personalizes_the_named_biases():
    cm = fb.client_manager(["1", "2"])
    strat = strategies.FedAttn(k=1, initial_parameters=_arrays(0.0, [0.0, 0.0]), min_fit_clients=2, min_available_clients=2)
    ins = strat.configure_fit(1, strat.initial_parameters, cm)
    assert len(ins) == 2 and all(fit_ins.config[CLIENT_ALGORITHM] == "fedattn" for _, fit_ins in ins)
    returned = {1: _arrays(1.0, [1.0, 2.0]), 2: _arrays(3.0, [5.0, 6.0])}
    z = {1: [0.0, 1.0], 2: [4.0, 1.0]}
    res = [(p, fb.fit_res(list(returned[int(p.cid)].values()), extras=_extras(z[int(p.cid)]))) for p, _ in ins]
    params, metrics = strat.aggregate_fit(1, res, [])
    assert metrics["clients-accepted"] == 2 and set(strat.method.representations) == {1, 2}  # legacy ids are ints
    for proxy, fit_ins in strat.configure_fit(2, params, cm):
        weight, bias = parameters_to_ndarrays(fit_ins.parameters)
        assert np.allclose(weight, 2.0) and np.allclose(bias, returned[int(proxy.cid)]["fc.bias"])


def test_legacy_fedattn_without_parameter_names_is_refused():
    with pytest.raises(ValueError, match="has none"):
        strategies.FedAttn(initial_parameters=fb.parameters(list(_arrays(0.0, [0.0, 0.0]).values())))


# --- one whole run -------------------------------------------------------------------------------

def test_short_run_as_recorded_and_its_attention_module_saved(short_runs):
    summary = short_runs("fedattn")
    assert_as_recorded("fedattn", summary)
    saved = load_state(summary["folder"] / SERVER_STATE)["attention"]  # with the results, as in its checkpoints
    assert set(saved) == {"w_q", "w_k", "w_v"} and saved["w_q"].shape == saved["w_k"].shape and saved["w_q"].shape[1] == 16  # d_k
