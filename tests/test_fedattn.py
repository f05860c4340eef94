"""FedAttn (paper 003): neighbour search, the attention and its gradient, the client step, the server."""

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord

import fabricate as fb
import flower_pfl.methods.fedattn as fa
import strategies.message
from flower_pfl.layout import ParamLayout
from flower_pfl.models import DNN, MLR
from flower_pfl.solvers import MinibatchStream
from flower_pfl.wire import decode_flat, encode_vector


def test_nearest_neighbours_match_brute_force(monkeypatch):
    g = torch.Generator().manual_seed(0)
    points, queries = torch.randn(50, 4, generator=g), torch.randn(7, 4, generator=g)
    brute = [sorted(range(50), key=lambda j: float(((points[j] - q) ** 2).sum()))[:5] for q in queries]
    assert fa.nearest_neighbours(points, queries, 5).tolist() == brute
    assert fa.nearest_neighbours(points, points[:3], 1).tolist() == [[0], [1], [2]]  # a point is its own nearest
    assert fa.nearest_neighbours(points[:2], queries, 5).shape == (7, 2)  # k is capped at the points there are
    pytest.importorskip("faiss")
    monkeypatch.setattr(fa, "FAISS_MIN_WORK", 0)  # FAISS's exact index gives the same neighbours
    assert fa.nearest_neighbours(points, queries, 5).tolist() == brute


def test_bias_mask_by_name_or_by_rank():
    named = ParamLayout(names=("fc.weight", "fc.bias"), shapes=((2, 3), (2,)))
    assert fa.bias_mask(named).tolist() == [False] * 6 + [True] * 2
    unnamed = ParamLayout(names=("0", "1"), shapes=((2, 3), (2,)))  # legacy Flower: no names
    assert fa.bias_mask(unnamed).tolist() == [False] * 6 + [True] * 2


def test_with_one_neighbour_a_client_gets_its_own_biases_through_w_v():
    module = fa.BiasAttention(d_z=3, d_bias=4, d_k=2, generator=torch.Generator().manual_seed(1))
    z, own = torch.randn(1, 3), torch.randn(1, 1, 4)
    out, weights = module(z, z[:, None], own)
    assert torch.allclose(weights, torch.ones(1, 1)) and torch.allclose(out, own[:, 0])  # W_V starts as I
    with torch.no_grad():
        module.w_v.mul_(2.0)
    assert torch.allclose(module(z, z[:, None], own)[0], 2 * own[:, 0])


def test_attention_step_follows_the_chain_rule_by_finite_differences():
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


def test_representation_is_the_mean_input_of_the_last_layer():
    x = torch.randn(30, 5, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    dnn = DNN(5, 3, hidden=4)
    assert torch.allclose(fa.last_layer_input(dnn, x, batch_size=7), torch.relu(dnn.fc1(x)).mean(0), atol=1e-6)
    assert torch.allclose(fa.last_layer_input(MLR(5, 3), x), x.mean(0), atol=1e-6)  # one layer: the input


def _data():
    x = torch.randn(40, 5, generator=torch.Generator().manual_seed(2))
    return x, (x[:, 0] > 0).long()


def test_one_step_reports_the_bias_gradient_and_the_regularizer_pulls_to_the_global_biases():
    x, y = _data()
    torch.manual_seed(0)
    model = DNN(5, 3, hidden=4)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    idx = MinibatchStream(40, 8, torch.Generator().manual_seed(9)).next()
    loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
    expected = torch.cat([g.flatten() for g in torch.autograd.grad(loss, [model.fc1.bias, model.fc2.bias])])
    _, z, grad = fa.fedattn_local_sgd(model, x, y, steps=1, lr=0.1, batch_size=8, generator=torch.Generator().manual_seed(9))
    assert torch.allclose(grad, expected, atol=1e-6) and z.shape == (4,)

    model.load_state_dict(start)
    global_biases = [torch.full((4,), 5.0), torch.full((3,), 5.0)]
    _, _, with_reg = fa.fedattn_local_sgd(model, x, y, steps=1, lr=0.1, batch_size=8, bias_reg=2.0, global_biases=global_biases,
                                          generator=torch.Generator().manual_seed(9))
    pull = 2.0 * (torch.cat([start["fc1.bias"], start["fc2.bias"]]) - 5.0)  # ∂/∂b of reg/2 ||b − b_G||²
    assert torch.allclose(with_reg - expected, pull, atol=1e-5) and pull.abs().min() > 0


NAMES = ("fc.weight", "fc.bias")


def _arrays(w: float, b: list[float]) -> dict[str, np.ndarray]:
    return {"fc.weight": np.full((2, 3), w, np.float32), "fc.bias": np.array(b, np.float32)}


def _reply(msg, arrays, z, grad=(0.0, 0.0), n=10):
    return fb.train_reply(msg, arrays, num_examples=n, extras={fa.REPRESENTATION: encode_vector(torch.tensor(z)),
                                                               fa.BIAS_GRADIENT: encode_vector(torch.tensor(grad))})


@pytest.fixture(autouse=True)
def _identity():
    fb.set_task_identity()


def test_server_round_trip_fedavg_then_each_client_its_own_biases():
    grid = fb.FakeGrid([1, 2])
    strat = strategies.message.FedAttn(k=1, fraction_train=1.0, min_train_nodes=2, min_available_nodes=2)
    arrays = ArrayRecord({k: fb.Array(v) for k, v in _arrays(0.0, [0.0, 0.0]).items()})
    msgs = list(strat.configure_train(1, arrays, ConfigRecord({"lr": 0.1}), grid))
    assert all(m.content["config"]["fedattn"] is True for m in msgs)
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
    w_v = strat.server.module.w_v.detach().clone()
    strat.aggregate_train(2, [_reply(m, returned[m.metadata.dst_node_id], [1.0, 0.0], grad=[1.0, -1.0]) for m in msgs])
    assert not torch.equal(strat.server.module.w_v, w_v)  # the reported gradients trained the attention


def test_warmup_sends_the_global_model_and_the_regularizer_sends_the_global_biases():
    grid = fb.FakeGrid([1, 2])
    strat = strategies.message.FedAttn(k=1, warmup_rounds=2, bias_reg=0.5, fraction_train=1.0, min_train_nodes=2,
                                       min_available_nodes=2)
    arrays = ArrayRecord({k: fb.Array(v) for k, v in _arrays(0.0, [7.0, 8.0]).items()})
    for rnd in (1, 2):
        msgs = list(strat.configure_train(rnd, arrays, ConfigRecord(), grid))
        assert all(np.array_equal(m.content["arrays"]["fc.bias"].numpy(), arrays["fc.bias"].numpy()) for m in msgs)
        assert torch.equal(decode_flat(msgs[0].content["config"]["fedattn-global-biases"], 2), torch.tensor(arrays["fc.bias"].numpy()))
        arrays, _ = strat.aggregate_train(rnd, [_reply(m, _arrays(1.0, [float(m.metadata.dst_node_id)] * 2), [float(m.metadata.dst_node_id), 2.0])
                                                for m in msgs])
    msgs = list(strat.configure_train(3, arrays, ConfigRecord(), grid))
    for m in msgs:  # personalized now: each client's own biases
        assert m.content["arrays"]["fc.bias"].numpy().tolist() == [float(m.metadata.dst_node_id)] * 2


@pytest.mark.parametrize("extras, reason", [({fa.REPRESENTATION: encode_vector(torch.ones(2))}, "lacks"),
                                            ({fa.REPRESENTATION: encode_vector(torch.ones(2)), fa.BIAS_GRADIENT: b"\x00" * 4}, "expected 2"),
                                            ({fa.REPRESENTATION: encode_vector(torch.tensor([np.nan, 0.0])),
                                              fa.BIAS_GRADIENT: encode_vector(torch.ones(2))}, "NaN")])
def test_server_rejects_bad_fedattn_extras(extras, reason, caplog):
    grid = fb.FakeGrid([1, 2])
    strat = strategies.message.FedAttn(fraction_train=1.0, min_train_nodes=2, min_available_nodes=2)
    msgs = list(strat.configure_train(1, ArrayRecord({k: fb.Array(v) for k, v in _arrays(0.0, [0.0, 0.0]).items()}), ConfigRecord(), grid))
    good = _reply(msgs[0], _arrays(1.0, [1.0, 1.0]), [1.0, 2.0])
    bad = fb.train_reply(msgs[1], _arrays(9.0, [9.0, 9.0]), extras=extras)
    new, metrics = strat.aggregate_train(1, [good, bad])
    assert metrics["clients-rejected"] == 1 and np.allclose(new["fc.weight"].numpy(), 1.0)
    assert reason in caplog.text


def test_legacy_fedattn_personalizes_unnamed_biases():
    import strategies
    from flwr.common import parameters_to_ndarrays

    cm = fb.client_manager(["a", "b"])
    strat = strategies.FedAttn(k=1, initial_parameters=fb.parameters(list(_arrays(0.0, [0.0, 0.0]).values())),
                               min_fit_clients=2, min_available_clients=2)
    ins = strat.configure_fit(1, strat.initial_parameters, cm)
    returned = {"a": _arrays(1.0, [1.0, 2.0]), "b": _arrays(3.0, [5.0, 6.0])}
    z = {"a": [0.0, 1.0], "b": [4.0, 1.0]}
    res = [(p, fb.fit_res(list(returned[p.cid].values()), extras={fa.REPRESENTATION: encode_vector(torch.tensor(z[p.cid])),
                                                                  fa.BIAS_GRADIENT: encode_vector(torch.zeros(2))})) for p, _ in ins]
    params, _ = strat.aggregate_fit(1, res, [])
    for proxy, fit_ins in strat.configure_fit(2, params, cm):
        weight, bias = parameters_to_ndarrays(fit_ins.parameters)
        assert np.allclose(weight, 2.0) and np.allclose(bias, returned[proxy.cid]["fc.bias"])


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
