"""FedRoD: the balanced softmax by hand, one client step by hand (the generic model on the balanced
loss, the personal head on the summed logits with nothing flowing back), the kept state, the
personalized predictor at evaluation, a round's clients trained together as one by one, FedAvg on the server,
the refused settings, one whole run."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from batching import BATCH, assert_together_is_one_by_one, clients, load
from batching import LR as BATCH_LR
from floats import assert_same_math
from flwr.app import RecordDict

from client_apps.own_loop import algorithm_for
from flower_pfl.engine.batched import unbatched
from flower_pfl.engine.client_algorithm import BATCH_SIZE, CLIENT_ALGORITHM, LOCAL_STEPS, LR, TrainData, train_locally
from flower_pfl.engine.client_metrics import GLOBAL_ACCURACY
from flower_pfl.engine.evaluation import evaluate
from flower_pfl.engine.layout import flatten_module
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.engine.reply_checks import RawReply
from flower_pfl.experiment.models import DNN, build_model
from flower_pfl.methods.fedrod import (
    BALANCED,
    PERSONAL_HEAD,
    FedRoD,
    FedRoDClient,
    Personalized,
    balanced_softmax_loss,
)
from flower_pfl.methods.registry import client_algorithm_for

from .runs import assert_as_recorded

CONFIG = {LR: 0.1, LOCAL_STEPS: 1, BATCH_SIZE: 6, CLIENT_ALGORITHM: "fedrod", BALANCED: True}


def _data():
    x = torch.randn(6, 3, generator=torch.Generator().manual_seed(0))
    return x, torch.tensor([0, 0, 0, 0, 1, 1])


def _model(seed: int = 1) -> DNN:
    torch.manual_seed(seed)
    return DNN(3, 3, hidden=4)


def test_balanced_softmax_by_hand():
    """−log(n_y e^{g_y} / Σ_c n_c e^{g_c}); a class the client never saw (n_c = 0) drops out."""
    logits, counts = torch.tensor([[1.0, 2.0, 0.5]]), torch.tensor([3, 1, 0])
    want = -math.log(3 * math.exp(1.0) / (3 * math.exp(1.0) + 1 * math.exp(2.0)))
    assert balanced_softmax_loss(logits, torch.tensor([0]), counts).item() == pytest.approx(want, rel=1e-6)
    assert balanced_softmax_loss(logits, torch.tensor([1]), torch.tensor([1, 1, 1])).item() == pytest.approx(
        F.cross_entropy(logits, torch.tensor([1])).item())  # balanced classes: plain cross-entropy


def test_one_step_by_hand():
    x, y = _data()
    model, ref = _model(), _model()
    state: dict = {}
    train_locally(FedRoDClient(model, CONFIG, state), model, TrainData(x, y), steps=1, lr=0.1, batch_size=6,
                  generator=torch.Generator().manual_seed(0))
    counts = torch.tensor([4, 2, 0])
    z = torch.relu(ref.fc1(x))  # the representation, before the step
    g = ref.fc2(z)
    grads = torch.autograd.grad(balanced_softmax_loss(g, y, counts), list(ref.parameters()))
    w, b = torch.zeros(3, 4, requires_grad=True), torch.zeros(3, requires_grad=True)  # the personal head starts at zero
    gw, gb = torch.autograd.grad(F.cross_entropy(g.detach() + z.detach() @ w.T + b, y), [w, b])
    with torch.no_grad():
        for p, d in zip(ref.parameters(), grads):
            p -= 0.1 * d
    torch.testing.assert_close(flatten_module(model), flatten_module(ref))  # the personal loss reaches neither body nor generic head
    torch.testing.assert_close(state[PERSONAL_HEAD][0], -0.1 * gw)
    torch.testing.assert_close(state[PERSONAL_HEAD][1], -0.1 * gb)


def test_the_balanced_loss_takes_the_counts_of_the_whole_training_split():
    """A minibatch of 2 of the 6 samples still uses the split's counts (4, 2, 0): the step reads them in ``begin``."""
    x, y = _data()
    model = _model()
    step = FedRoDClient(model, CONFIG, {})
    step.begin(model, TrainData(x, y))
    assert step.counts.tolist() == [4, 2, 0]


def test_the_next_round_continues_from_the_kept_head():
    x, y = _data()
    state: dict = {}
    for _ in range(2):
        model = _model()
        train_locally(FedRoDClient(model, CONFIG, state), model, TrainData(x, y), steps=1, lr=0.1, batch_size=6,
                      generator=torch.Generator().manual_seed(0))
    first: dict = {}
    model = _model()
    train_locally(FedRoDClient(model, CONFIG, first), model, TrainData(x, y), steps=1, lr=0.1, batch_size=6,
                  generator=torch.Generator().manual_seed(0))
    assert not torch.allclose(state[PERSONAL_HEAD][0], first[PERSONAL_HEAD][0])  # two steps of the head, not one


def test_without_the_balanced_loss_the_generic_step_is_plain_sgd():
    x, y = _data()
    model, ref = _model(), _model()
    train_locally(FedRoDClient(model, {**CONFIG, BALANCED: False}, {}), model, TrainData(x, y), steps=1, lr=0.1, batch_size=6,
                  generator=torch.Generator().manual_seed(0))
    grads = torch.autograd.grad(F.cross_entropy(ref(x), y), list(ref.parameters()))
    with torch.no_grad():
        for p, d in zip(ref.parameters(), grads):
            p -= 0.1 * d
    torch.testing.assert_close(flatten_module(model), flatten_module(ref))


def test_evaluation_adds_the_personal_logits_and_reports_the_generic_accuracy():
    x, y = _data()
    model = _model()
    test = lambda m: evaluate(m, x, y)
    generic = evaluate(model, x, y)
    out, extra = FedRoDClient.evaluation_model(model, {CLIENT_ALGORITHM: "fedrod"}, {}, TrainData(x, y), test)
    assert extra == {GLOBAL_ACCURACY: generic.accuracy}
    assert isinstance(out, Personalized) and torch.equal(out(x), model(x))  # no personal head yet: the generic prediction
    head = [torch.randn(3, 4), torch.randn(3)]
    out, _ = FedRoDClient.evaluation_model(model, {CLIENT_ALGORITHM: "fedrod"}, {PERSONAL_HEAD: head}, TrainData(x, y), test)
    torch.testing.assert_close(out(x), model(x) + torch.relu(model.fc1(x)) @ head[0].T + head[1])


def test_the_step_needs_state_and_the_package_loop():
    with pytest.raises(ValueError, match="state"):
        FedRoDClient(_model(), CONFIG)
    with pytest.raises(ValueError, match="ClientApp"):
        algorithm_for(CONFIG, _model(), RecordDict())


@pytest.mark.parametrize("balanced", [True, False], ids=["balanced", "cross-entropy"])
@pytest.mark.parametrize("name", ["dnn", "dnn-bn"])
def test_a_round_s_clients_train_together_as_one_by_one(name, balanced):
    """A second round: each client continues from the personal head its first round left (the first client
    never trained: zeros), with its own class counts; the models, losses and kept heads are the same both ways."""
    model = build_model(name, (6,), 3, seed=0)
    assert unbatched(FedRoDClient, model) is None
    config = {**CONFIG, LR: BATCH_LR, BALANCED: balanced}
    datas, starts = clients(model, (6,))
    firsts: list[dict] = [{} for _ in datas]
    for i in range(1, len(datas)):
        first = copy.deepcopy(model)
        load(first, starts[i])
        train_locally(FedRoDClient(first, config, firsts[i]), first, datas[i], steps=3, lr=BATCH_LR, batch_size=BATCH,
                      generator=torch.Generator().manual_seed(10 + i))
    made: list[dict] = []

    def make(m, i):
        made.append(dict(firsts[i]))
        return FedRoDClient(m, config, made[-1])

    assert_together_is_one_by_one(model, (6,), make)
    assert len(made) == 2 * len(datas)
    for alone, together in zip(made[:len(datas)], made[len(datas):]):
        for a, b in zip(alone[PERSONAL_HEAD], together[PERSONAL_HEAD]):
            assert_same_math(b, a)
    assert not torch.equal(made[0][PERSONAL_HEAD][0], made[1][PERSONAL_HEAD][0])


def _named(value: float) -> dict[str, np.ndarray]:
    shapes = {"fc1.weight": (2, 3), "fc1.bias": (2,), "fc2.weight": (2, 2), "fc2.bias": (2,)}
    return {k: np.full(s, value, dtype=np.float32) for k, s in shapes.items()}


def test_the_server_is_fedavg_and_asks_for_the_step_in_training_and_evaluation():
    server = MethodServer(FedRoD(balanced=False), clients_per_round=2)
    server.initialize(_named(0.0))
    plan = server.plan_training(1, [1, 2])
    assert all(ins.config == {CLIENT_ALGORITHM: "fedrod", BALANCED: False} for ins in plan)
    assert client_algorithm_for(plan[0].config) is FedRoDClient
    new = server.aggregate(1, [server.check(RawReply(cid, list(_named(v).values()), list(_named(0)), n, {"num-examples": n}))
                               for cid, v, n in ((1, 1.0, 1), (2, 4.0, 3))])
    torch.testing.assert_close(new, torch.full((14,), 3.25))
    assert all(ins.config == {CLIENT_ALGORITHM: "fedrod"} and torch.equal(ins.model, new)
               for ins in server.plan_evaluation(1, [1, 2], 1.0))


def test_bad_hyperparameters_are_refused():
    with pytest.raises(ValueError, match="balanced = 'yes' is invalid"):
        FedRoD(balanced="yes")  # type: ignore[arg-type]


def test_short_run_as_recorded_and_personal_heads_beat_fedavg(short_runs):
    rod = short_runs("fedrod")
    assert rod["bmta"] > short_runs("fedavg")["bmta"] + 0.2  # observed 0.706 vs 0.306
    assert_as_recorded("fedrod", rod)
