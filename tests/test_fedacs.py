"""FedACS (paper 001): thresholded cosine-similarity weights, eq. 4, and its strategies."""

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord

import fabricate as fb
import strategies
import strategies.message
from flower_pfl.attention import cosine_similarity_matrix, quantile_threshold_weights
from flower_pfl.methods import FedACSRule

S = torch.tensor([[1.0, 0.8, 0.1], [0.8, 1.0, -0.2], [0.1, -0.2, 1.0]])
# sorted entries: -.2 -.2 .1 .1 .8 .8 1 1 1


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


def test_server_step_is_eq_4():
    models = torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.2, 0.0], [0.0, 0.0, 1.0]])
    rule = FedACSRule(p=0.5)
    out, weights = rule.personalize(models, layout=None)
    s = cosine_similarity_matrix(models)
    keep = (s > rule.last_delta) & (s > 0) | torch.eye(3, dtype=torch.bool)
    manual = torch.stack([(keep[i] * s[i]) @ models / (keep[i] * s[i]).sum() for i in range(3)])
    assert torch.allclose(out, manual) and torch.allclose(weights["model"].sum(1), torch.ones(3))
    with pytest.raises(ValueError, match="p must be"):
        FedACSRule(p=1.0)


@pytest.fixture(autouse=True)
def _identity():
    fb.set_task_identity()


def _arrays(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"fc.weight": rng.normal(size=(2, 3)).astype(np.float32), "fc.bias": rng.normal(size=2).astype(np.float32)}


def test_threshold_is_recomputed_every_round_and_clients_get_their_u_i():
    grid = fb.FakeGrid(range(8))
    strat = strategies.message.FedACS(p=0.6, clients_per_round=8, min_available_nodes=1)
    init = ArrayRecord({k: fb.Array(v) for k, v in _arrays(0).items()})
    deltas = []
    for rnd in (1, 2, 3):
        msgs = list(strat.configure_train(rnd, init, ConfigRecord({"lr": 0.1}), grid))
        stored = strat.server.stored_models([m.metadata.dst_node_id for m in msgs])
        expected_delta = float(torch.quantile(cosine_similarity_matrix(stored).flatten().double(), 0.6))
        assert strat.rule.last_delta == pytest.approx(expected_delta, abs=1e-6)
        deltas.append(strat.rule.last_delta)
        weights, _, _ = quantile_threshold_weights(cosine_similarity_matrix(stored), 0.6)
        for i, m in enumerate(msgs):
            got = torch.cat([torch.as_tensor(v.numpy()).flatten() for v in m.content["arrays"].values()])
            assert torch.allclose(got, weights[i] @ stored, atol=1e-6)
            assert m.content["config"]["proximal-mu"] == 0.0  # eq. 5: plain local steps from u_i
        strat.aggregate_train(rnd, [fb.train_reply(m, _arrays(100 * rnd + m.metadata.dst_node_id)) for m in msgs])
    assert deltas[0] == pytest.approx(1.0)  # round 1: every stored model is the initial one
    assert deltas[1] != pytest.approx(deltas[2])


def test_legacy_fedacs_sends_the_same_models():
    cm = fb.client_manager([str(i) for i in range(5)])
    legacy = strategies.FedACS(p=0.3, clients_per_round=5, min_available_clients=1,
                               initial_parameters=fb.parameters(list(_arrays(0).values())))
    ins = legacy.configure_fit(1, legacy.initial_parameters, cm)
    legacy.aggregate_fit(1, [(p, fb.fit_res(list(_arrays(int(p.cid) + 1).values()))) for p, _ in ins], [])
    ins = legacy.configure_fit(2, legacy.initial_parameters, cm)
    stored = legacy.server.stored_models([p.cid for p, _ in ins])
    weights, _, _ = quantile_threshold_weights(cosine_similarity_matrix(stored), 0.3)
    from flwr.common import parameters_to_ndarrays
    for i, (_, fi) in enumerate(ins):
        got = torch.cat([torch.as_tensor(a).flatten() for a in parameters_to_ndarrays(fi.parameters)])
        assert torch.allclose(got, weights[i] @ stored, atol=1e-6)
