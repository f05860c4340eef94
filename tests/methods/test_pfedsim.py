"""pFedSim (Tan et al. 2023): the classifier similarity and the −log(1 − s) weights by hand, the server
with fabricated replies (FedAvg warm-up, then bodies averaged by similarity with the heads kept), what
it refuses, the plain client in a user's loop, and short runs (within the warm-up it is FedAvg, up to the
order of float sums; after it, not)."""

from __future__ import annotations

import math

import fabricate as fb
import numpy as np
import pytest
import torch
from floats import assert_same_math, same_math
from flwr.app import RecordDict

from client_apps.own_loop import algorithm_for
from flower_pfl.engine.client_algorithm import CLIENT_ALGORITHM, LR, ClientAlgorithm, TrainData, train_locally
from flower_pfl.engine.layout import flatten_module
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.engine.reply_checks import RawReply
from flower_pfl.experiment.models import DNN
from flower_pfl.methods.pfedsim import SELF_SIMILARITY, PFedSim, classifier_similarity, similarity_weights

from .runs import assert_as_recorded, short_run

SELF = -math.log(1 - SELF_SIMILARITY)  # a client's own weight before normalization, 9.21


def _model(seed: int = 0) -> DNN:
    torch.manual_seed(seed)
    return DNN(4, 3, hidden=2)  # body fc1: 10 values; classifier fc2: a (3, 2) weight and 3 biases


def _arrays(body: float, head: list[list[float]] | None = None, bias: float | None = None) -> dict[str, np.ndarray]:
    out = {k: np.full(t.shape, body, np.float32) for k, t in _model().state_dict().items()}
    out["fc2.weight"] = np.array(head if head is not None else [[body] * 2] * 3, np.float32)
    out["fc2.bias"] = np.full(3, body if bias is None else bias, np.float32)
    return out


def _reply(cid: int, arrays: dict[str, np.ndarray], n: int = 10) -> RawReply:
    return RawReply(cid, list(arrays.values()), list(arrays), n, {}, {})


def _flat(arrays: dict[str, np.ndarray]) -> torch.Tensor:
    return torch.cat([torch.as_tensor(a).flatten() for a in arrays.values()])


# --- the math, by hand ----------------------------------------------------------------------------

def test_similarity_is_the_mean_cosine_of_the_classifiers_rows_clipped_at_zero():
    heads = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[1.0, 1.0], [0.0, 2.0]], [[-1.0, 0.0], [0.0, -1.0]]])
    s = classifier_similarity(heads)
    assert s[0, 1] == pytest.approx((1 / math.sqrt(2) + 1.0) / 2) and s[1, 0] == s[0, 1]
    assert s[0, 2] == 0.0 and s[1, 2] == 0.0  # mean cosines −1 and −(1/√2 + 1)/2: no similarity
    assert torch.allclose(s.diagonal(), torch.ones(3))


def test_weights_are_minus_log_one_minus_s_normalized_with_the_client_itself_at_0_9999():
    s = torch.tensor([[1.0, 0.5, 0.0], [0.5, 0.2, 1.0]], dtype=torch.float64)  # the diagonal is the client itself
    rows = [[SELF, math.log(2), 0.0], [math.log(2), SELF, SELF]]  # s = 1 off the diagonal is capped at 0.9999
    expected = torch.tensor([[v / sum(r) for v in r] for r in rows], dtype=torch.float64)
    assert torch.allclose(similarity_weights(s), expected)


# --- the server -----------------------------------------------------------------------------------

HEAD_1, HEAD_2 = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], [[1.0, 1.0], [0.0, 1.0], [1.0, 1.0]]


def _warmed_up() -> MethodServer:
    """Round 1 of FedAvg (client 1: all 1.0, 10 samples; client 2: all 4.0, 30 samples), then a round of
    personalization in which clients 1 and 2 return bodies 1.0 and 2.0 with the heads ``HEAD_1``, ``HEAD_2``."""
    server = MethodServer(PFedSim(warmup=1), clients_per_round=2)
    server.initialize(_arrays(0.0))
    server.plan_training(1, [1, 2])
    server.aggregate(1, [server.check(_reply(1, _arrays(1.0), 10)), server.check(_reply(2, _arrays(4.0), 30))])
    server.plan_training(2, [1, 2])
    server.aggregate(2, [server.check(_reply(1, _arrays(1.0, HEAD_1, 0.5))), server.check(_reply(2, _arrays(2.0, HEAD_2, -0.5)))])
    return server


def test_warm_up_is_fedavg_and_its_model_becomes_every_clients_own():
    server = MethodServer(PFedSim(warmup=1), clients_per_round=2)
    server.initialize(_arrays(0.0))
    plan = server.plan_training(1, [1, 2])
    assert all(torch.all(ins.model == 0.0) for ins in plan) and server.method.client_algorithm() is ClientAlgorithm
    server.aggregate(1, [server.check(_reply(1, _arrays(1.0), 10)), server.check(_reply(2, _arrays(4.0), 30))])
    fedavg = (10 * 1.0 + 30 * 4.0) / 40
    assert all(torch.allclose(ins.model, torch.full_like(ins.model, fedavg)) for ins in server.plan_evaluation(1, [1, 2, 3], 1.0))
    assert all(torch.allclose(ins.model, torch.full_like(ins.model, fedavg)) for ins in server.plan_training(2, [1, 3]))
    assert server.method.similarity == {}  # no two clients trained together after the warm-up yet


def test_after_the_warm_up_bodies_are_averaged_by_classifier_similarity_and_heads_stay_own():
    server = _warmed_up()
    s12 = (1 / math.sqrt(2) + 1.0 + 1.0) / 3  # rows: cos((1,0),(1,1)), cos((0,1),(0,1)), cos((1,1),(1,1))
    assert server.method.similarity == {1: {2: pytest.approx(s12)}, 2: {1: pytest.approx(s12)}}
    sent = {ins.client_id: ins.model for ins in server.plan_training(3, [1, 3])}
    w = -math.log(1 - s12)
    own = _flat(_arrays(1.0, HEAD_1, 0.5))
    assert torch.allclose(sent[1][:10], torch.full((10,), (SELF * 1.0 + w * 2.0) / (SELF + w)))  # client 2's body mixed in
    assert torch.equal(sent[1][10:], own[10:])  # its own classifier
    assert torch.allclose(sent[3], torch.full((19,), 3.25))  # similar to none: the warm-up's model
    evaluated = {ins.client_id: ins.model for ins in server.plan_evaluation(3, [1, 2, 3], 1.0)}
    assert torch.equal(evaluated[1], own) and torch.equal(evaluated[2], _flat(_arrays(2.0, HEAD_2, -0.5)))  # as trained


def test_dissimilar_classifiers_keep_their_bodies_and_the_state_round_trips():
    server = MethodServer(PFedSim(warmup=0), clients_per_round=2)
    server.initialize(_arrays(0.0))
    server.plan_training(1, [1, 2])
    opposite = [[-v for v in row] for row in HEAD_1]
    server.aggregate(1, [server.check(_reply(1, _arrays(1.0, HEAD_1))), server.check(_reply(2, _arrays(2.0, opposite)))])
    assert server.method.similarity[1][2] == 0.0
    state = server.method.get_state()
    again = MethodServer(PFedSim(warmup=0), clients_per_round=2)
    again.initialize(_arrays(0.0))
    again.method.set_state(state)
    for s in (server, again):
        sent = {ins.client_id: ins.model for ins in s.plan_training(2, [1, 2])}
        assert torch.equal(sent[1], _flat(_arrays(1.0, HEAD_1))) and torch.equal(sent[2], _flat(_arrays(2.0, opposite)))


def test_bad_settings_are_refused_and_the_client_is_plain_sgd_in_a_users_loop():
    with pytest.raises(ValueError, match="warmup"):
        PFedSim(warmup=-1)
    assert "one layer" in PFedSim.check_model(fb.facts("mlr")) and PFedSim.check_model(fb.facts("cnn")) is None
    x = torch.randn(24, 4, generator=torch.Generator().manual_seed(0))
    y = (x[:, 0] > 0).long()
    ours, theirs = _model(), _model()
    train_locally(ClientAlgorithm(ours, {}), ours, TrainData(x, y), steps=3, lr=0.1, batch_size=8, generator=torch.Generator().manual_seed(1))
    step = algorithm_for({LR: 0.1}, theirs, RecordDict(), torch.optim.SGD(theirs.parameters(), lr=0.1))
    extras = fb.user_loop(theirs, step, x, y, lr=0.1, batch_size=8, steps=3, seed=1)
    assert_same_math(flatten_module(ours), flatten_module(theirs))
    assert CLIENT_ALGORITHM not in extras


# --- a whole run ----------------------------------------------------------------------------------

def test_short_run_as_recorded_is_fedavg_within_the_warm_up_and_differs_after_it(short_runs, tmp_path):
    run, fedavg = short_runs("pfedsim"), short_runs("fedavg")
    assert run["train_loss"] == same_math(fedavg["train_loss"])  # 6 rounds, all within the default warm-up
    assert run["final_accuracy"] == pytest.approx(fedavg["final_accuracy"])
    early = short_run("pfedsim", tmp_path, **{"pfedsim-warmup-rounds": 2})
    # round 3 starts every client from the warm-up's model; from round 4 on, bodies are mixed by similarity
    assert early["train_loss"][:3] == same_math(fedavg["train_loss"][:3])
    assert early["train_loss"][3:] != pytest.approx(fedavg["train_loss"][3:], rel=1e-3)
    assert_as_recorded("pfedsim", run)


def test_after_the_warm_up_both_apis_agree_and_a_resumed_run_gives_the_numbers_of_an_uninterrupted_one(tmp_path, monkeypatch):
    """The registry-wide twins and checkpoint tests run within the default warm-up; here past it."""
    from test_checkpoint import _interrupted, _numbers, _run
    from test_twins import OURS, _assert_same_state, _run_rounds, _twins

    legacy, message, initial = _twins(next(e for e in OURS if e.label == "pfedsim"), **{"pfedsim-warmup-rounds": 1})
    _run_rounds(legacy, message, initial)
    _assert_same_state(legacy, message)
    assert legacy.method.similarity and legacy.method.similarity == message.method.similarity
    monkeypatch.setenv("FLOWER_PFL_CLIENT_STATE_DIR", str(tmp_path / "client-state"))
    options = {"pfedsim-warmup-rounds": 2}
    whole = _run(tmp_path / "whole", "pfedsim", "message", **options)
    assert _numbers(_interrupted(tmp_path / "resumed", "pfedsim", "message", monkeypatch, **options)) == _numbers(whole)
