"""FedACS (Chen, Li, Shen): thresholded cosine-similarity weights (eq. 4) by hand, the
server algorithm through both strategies, its plain local-SGD client (eq. 5), and a short whole run."""

from __future__ import annotations

import fabricate as fb
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, ConfigRecord
from flwr.common import parameters_to_ndarrays

import strategies
import strategies.message
from client_apps.own_loop import algorithm_for
from flower_pfl.engine.client_algorithm import CLIENT_ALGORITHM, ClientAlgorithm, TrainData, train_locally
from flower_pfl.engine.minibatches import MinibatchStream
from flower_pfl.experiment.models import build_model
from flower_pfl.methods.attention import cosine_similarity_matrix, quantile_threshold_weights
from flower_pfl.methods.fedacs import FedACS
from flower_pfl.methods.registry import client_algorithm_for

from .runs import assert_as_recorded

S = torch.tensor([[1.0, 0.8, 0.1], [0.8, 1.0, -0.2], [0.1, -0.2, 1.0]])
# sorted entries: -.2 -.2 .1 .1 .8 .8 1 1 1


# ---------------------------------------------------------------- 1. eq. 4 by hand

def test_hand_computed_weights():
    # p = 0.3: position 0.3 * 8 = 2.4 between two 0.1s -> delta = 0.1; keep s > 0.1
    w, mask, delta = quantile_threshold_weights(S, 0.3)
    assert delta == pytest.approx(0.1)
    expected = torch.tensor([[1 / 1.8, 0.8 / 1.8, 0.0], [0.8 / 1.8, 1 / 1.8, 0.0], [0.0, 0.0, 1.0]])
    assert torch.allclose(w, expected)
    assert mask.tolist() == [[True, True, False], [True, True, False], [False, False, True]]


def test_p_zero_keeps_every_positively_similar_client():
    w, mask, delta = quantile_threshold_weights(S, 0.0)
    assert delta == pytest.approx(-0.2)
    assert torch.equal(mask, S > 0)
    assert torch.allclose(w[0], torch.tensor([1.0, 0.8, 0.1]) / 1.9)
    assert torch.allclose(w[2], torch.tensor([0.1, 0.0, 1.0]) / 1.1)


def test_p_near_one_leaves_each_client_alone_and_rows_sum_to_one():
    torch.manual_seed(0)
    sim = cosine_similarity_matrix(torch.randn(9, 30))
    for p in (0.0, 0.2, 0.5, 0.9):
        w, _, _ = quantile_threshold_weights(sim, p)
        assert torch.allclose(w.sum(1), torch.ones(9)) and (w >= 0).all()
    w, mask, _ = quantile_threshold_weights(sim, 0.99)
    assert torch.equal(mask, torch.eye(9, dtype=torch.bool)) and torch.allclose(w, torch.eye(9))


def test_server_algorithm_is_eq_4():
    models = torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.2, 0.0], [0.0, 0.0, 1.0]])
    method = FedACS(p=0.5)
    out, weights = method.personalize(models, layout=None)
    s = cosine_similarity_matrix(models)
    keep = (s > method.last_delta) & (s > 0) | torch.eye(3, dtype=torch.bool)
    manual = torch.stack([(keep[i] * s[i]) @ models / (keep[i] * s[i]).sum() for i in range(3)])
    assert torch.allclose(out, manual) and torch.allclose(weights["model"].sum(1), torch.ones(3))
    assert torch.equal(method.last_mask, keep) and torch.allclose(method.last_similarity, s)
    # by hand: s01 = 1/√1.04 ≈ 0.981, s02 = s12 = 0; the 0.5-quantile of the 9 entries is 0.981
    # (sorted: 0 0 0 0 .981 .981 1 1 1), so nobody passes s > δ but itself: every client is alone
    assert method.last_delta == pytest.approx(1 / 1.04 ** 0.5, rel=1e-6)
    assert torch.allclose(out, models)
    out, _ = FedACS(p=0.0).personalize(models, layout=None)  # δ = 0: clients 0 and 1 mix, 2 stays alone
    s01 = 1 / 1.04 ** 0.5
    assert torch.allclose(out[0], (models[0] + s01 * models[1]) / (1 + s01)) and torch.allclose(out[2], models[2])
    with pytest.raises(ValueError, match="p = 1.0"):
        FedACS(p=1.0)
    assert FedACS().train_config(1) == {} and FedACS().client_algorithm() is ClientAlgorithm  # eq. 5: plain local steps from u_i


# ---------------------------------------------------------------- 2. the server algorithm

@pytest.fixture(autouse=True)
def _identity():
    fb.set_task_identity()


def _arrays(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"fc.weight": rng.normal(size=(2, 3)).astype(np.float32), "fc.bias": rng.normal(size=2).astype(np.float32)}


def _flat(arrays) -> torch.Tensor:
    return torch.cat([torch.as_tensor(np.asarray(a)).flatten() for a in arrays])


def test_threshold_is_recomputed_every_round_and_clients_get_their_u_i():
    grid = fb.FakeGrid(range(8))
    strat = strategies.message.FedACS(p=0.6, clients_per_round=8, min_available_nodes=1)
    init = ArrayRecord({k: fb.Array(v) for k, v in _arrays(0).items()})
    deltas = []
    for rnd in (1, 2, 3):
        msgs = list(strat.configure_train(rnd, init, ConfigRecord({"lr": 0.1}), grid))
        stored = strat.method.store.get([m.metadata.dst_node_id for m in msgs])
        expected_delta = float(torch.quantile(cosine_similarity_matrix(stored).flatten().double(), 0.6))
        assert strat.method.last_delta == pytest.approx(expected_delta, abs=1e-6)
        deltas.append(strat.method.last_delta)
        weights, _, _ = quantile_threshold_weights(cosine_similarity_matrix(stored), 0.6)
        for i, m in enumerate(msgs):
            got = _flat(v.numpy() for v in m.content["arrays"].values())
            assert torch.allclose(got, weights[i] @ stored, atol=1e-6)
            assert m.content["config"][CLIENT_ALGORITHM] == "sgd"  # eq. 5: plain local steps from u_i
        _, metrics = strat.aggregate_train(rnd, [fb.train_reply(m, _arrays(100 * rnd + m.metadata.dst_node_id)) for m in msgs])
        assert metrics["clients-accepted"] == 8
    assert deltas[0] == pytest.approx(1.0)  # round 1: every stored model is the initial one
    assert deltas[1] != pytest.approx(deltas[2])
    assert len(strat.method.attention_weights.rounds) == 3


def test_legacy_fedacs_sends_the_same_models():
    cm = fb.client_manager([str(i) for i in range(5)])
    legacy = strategies.FedACS(p=0.3, clients_per_round=5, min_available_clients=1, initial_parameters=_arrays(0))
    ins = legacy.configure_fit(1, legacy.initial_parameters, cm)
    legacy.aggregate_fit(1, [(p, fb.fit_res(list(_arrays(int(p.cid) + 1).values()))) for p, _ in ins], [])
    ins = legacy.configure_fit(2, legacy.initial_parameters, cm)
    stored = legacy.method.store.get([int(p.cid) for p, _ in ins])
    assert torch.equal(stored, torch.stack([_flat(_arrays(int(p.cid) + 1).values()) for p, _ in ins]))
    weights, _, _ = quantile_threshold_weights(cosine_similarity_matrix(stored), 0.3)
    assert not torch.allclose(weights, torch.eye(5))  # someone mixes: the check below can fail
    for i, (_, fi) in enumerate(ins):
        assert torch.allclose(_flat(parameters_to_ndarrays(fi.parameters)), weights[i] @ stored, atol=1e-6)


# ---------------------------------------------------------------- 3. the client: plain local SGD (eq. 5)

def test_client_is_plain_sgd_from_u_i_in_a_users_loop_and_the_package_loop():
    lr, steps, batch = 0.1, 5, 8
    config = {**FedACS().train_config(1), "lr": lr, "local-steps": steps, "batch-size": batch}
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(30, 6, generator=g), torch.randint(0, 3, (30,), generator=g)
    users, package, reference = (build_model("dnn", (6,), 3, hidden_units=5, seed=1) for _ in range(3))
    assert client_algorithm_for(config) is ClientAlgorithm

    step = algorithm_for(config, users, optimizer=torch.optim.SGD(users.parameters(), lr=lr))
    optimizer = torch.optim.SGD(users.parameters(), lr=lr)
    stream = MinibatchStream(30, batch, torch.Generator().manual_seed(3))
    for _ in range(steps):
        idx = stream.next()
        optimizer.zero_grad()
        F.cross_entropy(users(x[idx]), y[idx]).backward()
        step.adjust_gradients(users, (x[idx], y[idx]))
        optimizer.step()
    assert step.finish(users, x) == {}

    result, extras = train_locally(client_algorithm_for(config)(package, config), package, TrainData(x, y), steps=steps, lr=lr,
                                   batch_size=batch, generator=torch.Generator().manual_seed(3))
    assert extras == {} and result.steps == steps

    stream = MinibatchStream(30, batch, torch.Generator().manual_seed(3))
    losses = []
    for _ in range(steps):  # w ← w − η ∇f_i(w; batch), written out
        idx = stream.next()
        loss = F.cross_entropy(reference(x[idx]), y[idx])
        grads = torch.autograd.grad(loss, list(reference.parameters()))
        losses.append(float(loss))
        with torch.no_grad():
            for p, gr in zip(reference.parameters(), grads):
                p -= lr * gr
    flat = [torch.cat([p.detach().flatten() for p in m.parameters()]) for m in (users, package, reference)]
    assert torch.allclose(flat[0], flat[1], atol=1e-6) and torch.allclose(flat[1], flat[2], atol=1e-6)
    assert result.loss == pytest.approx(sum(losses) / steps, rel=1e-5)


# ---------------------------------------------------------------- 4. a whole run

def test_short_run_as_recorded_and_better_than_fedavg(short_runs):
    summary = short_runs("fedacs")
    assert_as_recorded("fedacs", summary)
    assert summary["bmta"] > short_runs("fedavg")["bmta"] + 0.05
