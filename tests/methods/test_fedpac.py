"""FedPAC: the classifier-combination objective and its QP by hand, the client's head steps then body
steps with the alignment by hand and the two statistics it returns, the server with fabricated replies
(bodies averaged, heads combined by the QP's weights, prototypes weighted by class counts), what it
refuses, a short run (the alignment changes training; personal heads beat FedAvg)."""

from __future__ import annotations

import fabricate as fb
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from batching import STEPS, assert_together_is_one_by_one
from floats import assert_same_math
from flwr.app import RecordDict

from client_apps.own_loop import algorithm_for
from flower_pfl.engine.batched import _settings, unbatched
from flower_pfl.engine.client_algorithm import CLIENT_ALGORITHM, LOCAL_STEPS, LR, TrainData, train_locally
from flower_pfl.engine.feature_stats import FeatureStats, class_statistics
from flower_pfl.engine.layout import flatten_module
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.engine.minibatches import MinibatchStream
from flower_pfl.engine.model_split import head_module
from flower_pfl.engine.reply_checks import RawReply, UpdateRejected
from flower_pfl.engine.wire import encode_vector
from flower_pfl.experiment.models import DNN, build_model
from flower_pfl.methods.fedpac import (
    HEAD_STEPS,
    LAMBDA,
    LOCAL_PROTOTYPES,
    PROTOTYPES,
    STATISTICS,
    FedPAC,
    FedPACClient,
    combination_objectives,
    combination_weights,
    project_to_simplex,
    simplex_qp,
    variance_term,
)
from flower_pfl.methods.fedproto import decode_prototypes, encode_prototypes

from .features import seeded_dnn, three_classes
from .runs import assert_as_recorded, short_run

C, D = 3, 2  # classes, representation size (DNN(4, 3, hidden=2))


# --- the math, by hand ----------------------------------------------------------------------------

def _stats(shares, means, variances=(0.0, 0.0, 0.0)) -> FeatureStats:
    return FeatureStats(torch.tensor(shares), torch.tensor(means), torch.tensor(variances))


A = _stats([0.5, 0.5, 0.0], [[1.0, 0.0], [0.0, 2.0], [0.0, 0.0]], [1.0, 3.0, 0.0])
B = _stats([1.0, 0.0, 0.0], [[3.0, 1.0], [0.0, 0.0], [0.0, 0.0]], [2.0, 0.0, 0.0])


def test_variance_term_by_hand():
    """V = (1/n) Σ_k [p_k E||z||²_k − p_k² ||μ_k||²], E||z||²_k = variance + ||μ_k||²."""
    assert variance_term(A, 10) == pytest.approx((0.5 * (1 + 1) - 0.25 * 1 + 0.5 * (3 + 4) - 0.25 * 4) / 10)
    assert variance_term(B, 4) == pytest.approx((1.0 * (2 + 10) - 1.0 * 10) / 4)


def test_the_objective_is_variance_plus_bias_by_hand():
    p = combination_objectives([A, B], [10, 4])
    va, vb = variance_term(A, 10), variance_term(B, 4)
    # h_A = (0.5, 0), (0, 1), 0; h_B = (3, 1), 0, 0: ||h_A − h_B||² = 2.5² + 1 + 1 = 8.25
    torch.testing.assert_close(p[0], torch.tensor([[va, 0.0], [0.0, vb + 8.25]], dtype=torch.float64))
    torch.testing.assert_close(p[1], torch.tensor([[va + 8.25, 0.0], [0.0, vb]], dtype=torch.float64))
    alpha = torch.tensor([0.3, 0.7], dtype=torch.float64)  # αᵀ P_A α = Σ α_j² V_j + ||h_A − Σ α_j h_j||²
    assert float(alpha @ p[0] @ alpha) == pytest.approx(0.09 * va + 0.49 * vb + 0.49 * 8.25)


def test_projection_and_qp_on_the_simplex_by_hand():
    torch.testing.assert_close(project_to_simplex(torch.tensor([[0.5, 0.5, 0.5], [2.0, 0.0, 0.0], [-1.0, 0.3, 0.2]])),
                               torch.tensor([[1 / 3, 1 / 3, 1 / 3], [1.0, 0.0, 0.0], [0.0, 0.55, 0.45]]))
    v = torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64)  # diagonal P: α_j ∝ 1 / V_j
    torch.testing.assert_close(simplex_qp(torch.diag(v)[None])[0], (1 / v) / (1 / v).sum(), atol=1e-7, rtol=0)
    p = torch.tensor([[1.0, 0.0], [0.0, 0.0]], dtype=torch.float64)[None]  # the second client costs nothing
    torch.testing.assert_close(simplex_qp(p)[0], torch.tensor([0.0, 1.0], dtype=torch.float64), atol=1e-7, rtol=0)
    # 2 clients: α P α with α = (a, 1 − a) is minimal at a = (P22 − P12) / (P11 + P22 − 2 P12)
    p = torch.tensor([[3.0, 1.0], [1.0, 2.0]], dtype=torch.float64)
    assert float(simplex_qp(p[None])[0, 0]) == pytest.approx((2 - 1) / (3 + 2 - 2), abs=1e-7)


def test_small_weights_are_dropped_and_the_rest_renormalized():
    # one class each, V = 0.025 / 10, means 5 apart (bias 5): the other's weight V / (2V + 5) ≈ 5e-4 is dropped
    a = _stats([1.0, 0.0, 0.0], [[1.0, 0.0], [0.0, 0.0], [0.0, 0.0]], [0.025, 0.0, 0.0])
    b = _stats([1.0, 0.0, 0.0], [[3.0, 1.0], [0.0, 0.0], [0.0, 0.0]], [0.025, 0.0, 0.0])
    assert float(simplex_qp(combination_objectives([a, b], [10, 10]))[0, 1]) == pytest.approx(0.0025 / 5.005, rel=1e-4)
    alpha = combination_weights([a, b], [10, 10])
    assert alpha[0].tolist() == [1.0, 0.0] and alpha[1].tolist() == [0.0, 1.0]
    # A and B: α_AB = V_A / (V_A + V_B + 8.25), V_A = 0.325, V_B = 0.5, above the threshold: kept
    assert float(combination_weights([A, B], [10, 4])[0, 1]) == pytest.approx(0.325 / 9.075, rel=1e-5)


# --- the client -----------------------------------------------------------------------------------

def _data():
    return three_classes(40, 4)


def _model(seed: int = 0) -> DNN:
    return seeded_dnn(4, C, D, seed)


GLOBAL, KNOWN = torch.tensor([[0.5, -0.5], [1.0, 1.0], [0.0, 0.0]]), torch.tensor([True, True, False])
CONFIG = {LR: 0.1, LOCAL_STEPS: 3, LAMBDA: 2.0, HEAD_STEPS: 1, PROTOTYPES: encode_prototypes(KNOWN.float(), GLOBAL)}


def test_head_steps_then_body_steps_with_the_alignment_by_hand():
    x, y = _data()
    model, ref = _model(), _model()
    _, extras = train_locally(FedPACClient(model, CONFIG), model, TrainData(x, y), steps=3, lr=0.1, batch_size=8,
                              generator=torch.Generator().manual_seed(1))
    before = class_statistics(ref, x, y)
    stream = MinibatchStream(40, 8, torch.Generator().manual_seed(1))
    for step in range(3):
        idx = stream.next()
        z = torch.relu(ref.fc1(x[idx]))
        loss = F.cross_entropy(ref.fc2(z), y[idx])
        if step >= 1:  # body steps: the pull of the known classes' samples toward their prototypes
            loss = loss + 2.0 * (((z - GLOBAL[y[idx]]) ** 2).mean(1) * KNOWN[y[idx]]).mean()
        grads = torch.autograd.grad(loss, list(ref.parameters()))
        with torch.no_grad():
            for (name, p), g in zip(ref.named_parameters(), grads):
                if name.startswith("fc2") == (step < 1):
                    p -= 0.1 * g
    torch.testing.assert_close(flatten_module(model), flatten_module(ref))
    sent, trained = FeatureStats.decode(extras[STATISTICS], C, D), FeatureStats.decode(extras[LOCAL_PROTOTYPES], C, D)
    torch.testing.assert_close(sent.means, before.means)  # the received representation's
    torch.testing.assert_close(trained.means, class_statistics(ref, x, y).means)  # the trained one's
    assert extras[CLIENT_ALGORITHM] == "fedpac"


def test_the_first_round_has_no_alignment():
    x, y = _data()
    config = {k: v for k, v in CONFIG.items() if k != PROTOTYPES}
    with_pull, plain = _model(), _model()
    for model, cfg in ((with_pull, CONFIG), (plain, config)):
        train_locally(FedPACClient(model, cfg), model, TrainData(x, y), steps=3, lr=0.1, batch_size=8, generator=torch.Generator().manual_seed(1))
    unaligned = _model()
    train_locally(FedPACClient(unaligned, {**CONFIG, LAMBDA: 0.0}), unaligned, TrainData(x, y), steps=3, lr=0.1, batch_size=8,
                  generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(flatten_module(plain), flatten_module(unaligned))
    assert not torch.allclose(flatten_module(with_pull), flatten_module(plain), atol=1e-4)


def _same_statistics(a: dict, b: dict, classes: int, dim: int) -> None:
    """The received representation's statistics bit for bit, the trained one's within reordered float sums."""
    assert a[STATISTICS] == b[STATISTICS] and a[CLIENT_ALGORITHM] == b[CLIENT_ALGORITHM] == "fedpac"
    x, y = (FeatureStats.decode(e[LOCAL_PROTOTYPES], classes, dim) for e in (a, b))
    for field in ("shares", "means", "variances"):
        assert_same_math(getattr(y, field), getattr(x, field))


@pytest.mark.parametrize("name", ["dnn", "dnn-bn"])
@pytest.mark.parametrize("aligned", [False, True], ids=["first-round", "with-prototypes"])
def test_a_round_s_clients_train_as_one_computation(name, aligned):
    """Head steps then body steps, as one by one: the first round (no prototypes yet) and a later one (the
    pull toward the global prototypes of the classes that have one), as the server sends them."""
    model = build_model(name, (6,), 3)
    assert unbatched(FedPACClient, model) is None
    head = head_module(model)
    classes, dim = head.out_features, head.in_features
    server = FedPAC(lam=1.5, head_steps=2)
    server.prototypes = torch.randn(classes, dim, generator=torch.Generator().manual_seed(5))
    server.known = torch.tensor([True, False, True]) if aligned else torch.zeros(classes, dtype=torch.bool)
    config = {LR: 0.05, LOCAL_STEPS: STEPS, **server.train_config(4)}
    assert (PROTOTYPES in config) == aligned
    made = [FedPACClient(model, config) for _ in range(2)]
    assert _settings(made[0]) == _settings(made[1])  # nothing of a client's own keeps it out of the round's group
    assert_together_is_one_by_one(model, (6,), lambda m, i: FedPACClient(m, config),
                                  lambda a, b: _same_statistics(a, b, classes, dim))


def test_the_client_needs_the_package_loop_and_good_settings():
    with pytest.raises(ValueError, match="ClientApp"):
        algorithm_for({**CONFIG, CLIENT_ALGORITHM: "fedpac"}, _model(), RecordDict())
    with pytest.raises(ValueError, match="lambda"):
        FedPACClient(_model(), {**CONFIG, LAMBDA: -1.0})
    with pytest.raises(ValueError, match="fedpac-head-steps"):
        FedPACClient(_model(), {**CONFIG, HEAD_STEPS: 3})
    with pytest.raises(ValueError, match="fedpac-prototypes"):
        FedPACClient(_model(), {**CONFIG, PROTOTYPES: encode_vector(torch.zeros(4))})
    with pytest.raises(ValueError, match="lam = -1.0 is invalid"):
        FedPAC(lam=-1.0)
    with pytest.raises(ValueError, match="head_steps = -1 is invalid"):
        FedPAC(head_steps=-1)
    assert FedPAC.check_run({"model": "dnn", "fedpac-head-steps": 5, "local-steps": 5})[0] == "fedpac-head-steps"
    assert "one layer" in FedPAC.check_model(fb.facts("mlr")) and FedPAC.check_model(fb.facts("dnn")) is None


# --- the server -----------------------------------------------------------------------------------

def _arrays(body: float, head: float) -> dict[str, np.ndarray]:
    return {k: np.full(t.shape, head if k.startswith("fc2") else body, np.float32) for k, t in _model().state_dict().items()}


def _reply(cid, body, head, n, before, after=None, extras=None):
    a = _arrays(body, head)
    extras = {STATISTICS: before.encode(), LOCAL_PROTOTYPES: (after or before).encode()} if extras is None else extras
    return RawReply(cid, list(a.values()), list(a), n, {}, extras)


def test_server_averages_bodies_combines_heads_and_weights_prototypes():
    server = MethodServer(FedPAC(lam=0.5, head_steps=2), clients_per_round=2)
    server.initialize(_arrays(0.0, 0.0))
    plan = server.plan_training(1, [1, 2])
    assert all(ins.config == {CLIENT_ALGORITHM: "fedpac", LAMBDA: 0.5, HEAD_STEPS: 2} for ins in plan)  # no prototypes yet
    after_a = _stats([0.5, 0.5, 0.0], [[2.0, 2.0], [1.0, 0.0], [0.0, 0.0]])
    after_b = _stats([1.0, 0.0, 0.0], [[4.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    server.aggregate(1, [server.check(_reply(1, 1.0, 10.0, 10, A, after_a)), server.check(_reply(2, 3.0, 20.0, 30, B, after_b))])
    alpha = combination_weights([A, B], [10, 30])
    sent = {ins.client_id: ins for ins in server.plan_evaluation(1, [1, 2, 3], 1.0)}
    body, head = slice(0, 2 * 4 + 2), slice(2 * 4 + 2, None)
    for cid, row in ((1, 0), (2, 1)):
        assert torch.allclose(sent[cid].model[body], torch.full((10,), 2.5))  # (10·1 + 30·3) / 40
        assert torch.allclose(sent[cid].model[head], torch.full((9,), float(alpha[row] @ torch.tensor([10.0, 20.0]))))
    assert 0 < float(alpha[0, 1]) < 1  # a combination, not the client's own head
    assert torch.all(sent[3].model[head] == 0.0)  # a client that did not take part keeps its head
    flags, protos = decode_prototypes(server.plan_training(2, [1])[0].config[PROTOTYPES], C, D)
    assert flags.tolist() == [1.0, 1.0, 0.0]
    torch.testing.assert_close(protos, torch.tensor([[(5 * 2 + 30 * 4) / 35, 5 * 2 / 35], [1.0, 0.0], [0.0, 0.0]]))
    state = server.method.get_state()
    assert torch.equal(state["prototypes"], protos) and state["known"].tolist() == [True, True, False]


@pytest.mark.parametrize("extras, reason", [({}, "lacks 'fedpac-statistics'"),
                                            ({STATISTICS: A.encode()}, "lacks 'fedpac-local-prototypes'"),
                                            ({STATISTICS: A.encode(), LOCAL_PROTOTYPES: b"\x00" * 8}, "expected 12"),
                                            ({STATISTICS: encode_vector(torch.full((12,), float("inf"))), LOCAL_PROTOTYPES: A.encode()}, "NaN"),
                                            ({STATISTICS: _stats([0.5, 0.5, 0.0], [[0.0, 0.0]] * 3, [0.0, -1.0, 0.0]).encode(),
                                              LOCAL_PROTOTYPES: A.encode()}, "variances")])
def test_server_refuses_bad_statistics(extras, reason):
    server = MethodServer(FedPAC(), clients_per_round=1)
    server.initialize(_arrays(0.0, 0.0))
    server.plan_training(1, [1])
    with pytest.raises(UpdateRejected, match=reason):
        server.check(_reply(1, 1.0, 1.0, 10, A, extras=extras))


# --- a whole run ----------------------------------------------------------------------------------

def test_short_run_as_recorded_the_alignment_matters_and_it_beats_fedavg(short_runs, tmp_path):
    run, fedavg = short_runs("fedpac"), short_runs("fedavg")
    unaligned = short_run("fedpac", tmp_path, **{"fedpac-lambda": 0.0})
    assert run["train_loss"][0] == pytest.approx(unaligned["train_loss"][0])  # no prototypes in round 1
    assert run["train_loss"][1:] != pytest.approx(unaligned["train_loss"][1:], rel=1e-3)
    assert run["bmta"] > fedavg["bmta"]  # observed 0.397 vs 0.306
    assert_as_recorded("fedpac", run)
