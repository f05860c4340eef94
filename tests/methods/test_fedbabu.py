"""FedBABU: the head frozen in training (package loop, a user's loop, any optimizer), FedAvg of the
bodies with the initial head kept (fabricated replies), the evaluation's fine-tuning by hand, the
refused settings, one whole run with and without fine-tuning."""

from __future__ import annotations

import fabricate as fb
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import Context, RecordDict

from client_apps.app import Node
from client_apps.own_loop import algorithm_for
from flower_pfl.engine.client_algorithm import BATCH_SIZE, CLIENT_ALGORITHM, LOCAL_STEPS, LR, TrainData, train_locally
from flower_pfl.engine.client_metrics import GLOBAL_ACCURACY
from flower_pfl.engine.evaluation import evaluate
from flower_pfl.engine.layout import flatten_module
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.engine.minibatches import MinibatchStream
from flower_pfl.engine.reply_checks import RawReply
from flower_pfl.experiment.config import ConfigError, ExperimentConfig
from flower_pfl.experiment.models import DNN
from flower_pfl.methods.fedbabu import FINETUNE_PART, FINETUNE_SEED, FINETUNE_STEPS, HEAD_LAYERS, FedBABU, FedBABUClient

from .runs import assert_as_recorded, short_run


def _data():
    x = torch.randn(24, 3, generator=torch.Generator().manual_seed(0))
    return x, (x[:, 0] - x[:, 1] > 0).long()


def _model(seed: int = 1) -> DNN:
    torch.manual_seed(seed)
    return DNN(3, 2, hidden=4)


CONFIG = {CLIENT_ALGORITHM: "fedbabu", LR: 0.1, LOCAL_STEPS: 3, BATCH_SIZE: 8, HEAD_LAYERS: 1}


# --- the client ------------------------------------------------------------------------------------

def test_training_moves_the_body_only_in_both_loops():
    x, y = _data()
    ours, mine, ref = _model(), _model(), _model()
    train_locally(FedBABUClient(ours, CONFIG), ours, TrainData(x, y), steps=3, lr=0.1, batch_size=8,
                  generator=torch.Generator().manual_seed(2))
    extras = fb.user_loop(mine, algorithm_for(CONFIG, mine), x, y, lr=0.1, batch_size=8, steps=3, seed=2)
    stream, body = MinibatchStream(24, 8, torch.Generator().manual_seed(2)), [ref.fc1.weight, ref.fc1.bias]
    for _ in range(3):  # by hand: SGD on the body, the head as initialised
        idx = stream.next()
        grads = torch.autograd.grad(F.cross_entropy(ref(x[idx]), y[idx]), body)
        with torch.no_grad():
            for p, g in zip(body, grads):
                p -= 0.1 * g
    assert extras == {CLIENT_ALGORITHM: "fedbabu"}
    for model in (ours, mine):
        torch.testing.assert_close(flatten_module(model), flatten_module(ref))
    assert torch.equal(ours.fc2.weight, _model().fc2.weight) and not torch.equal(ours.fc1.weight, _model().fc1.weight)


def test_the_head_stays_frozen_under_momentum_and_weight_decay():
    x, y = _data()
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1)
    step = algorithm_for(CONFIG, model, None, optimizer)
    for _ in range(3):
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        step.adjust_gradients(model, (x, y))
        optimizer.step()
    assert torch.equal(model.fc2.weight, _model().fc2.weight) and torch.equal(model.fc2.bias, _model().fc2.bias)


def _evaluation(part: str, steps: int = 4) -> dict:
    return {**FedBABU(finetune_steps=steps, finetune_lr=0.3, finetune_batch_size=8, finetune_part=part).evaluation_config()}


@pytest.mark.parametrize("part", ["head", "full"])
def test_evaluation_reports_the_global_model_then_fine_tunes_on_the_training_split_by_hand(part):
    x, y = _data()
    x_test, y_test = x[:8] + 0.5, y[:8]
    model, ref = _model(), _model()
    tested = evaluate(_model(), x_test, y_test).accuracy
    out, extra = FedBABUClient.evaluation_model(model, _evaluation(part), None, TrainData(x, y), lambda m: evaluate(m, x_test, y_test))
    assert extra == {GLOBAL_ACCURACY: tested}  # the received model's accuracy, before fine-tuning
    stream = MinibatchStream(24, 8, torch.Generator().manual_seed(FINETUNE_SEED))
    params = [ref.fc2.weight, ref.fc2.bias] if part == "head" else list(ref.parameters())
    for _ in range(4):  # τ_f steps of size 0.3 on training minibatches
        idx = stream.next()
        grads = torch.autograd.grad(F.cross_entropy(ref(x[idx]), y[idx]), params)
        with torch.no_grad():
            for p, g in zip(params, grads):
                p -= 0.3 * g
    torch.testing.assert_close(flatten_module(out), flatten_module(ref))
    assert torch.equal(out.fc1.weight, _model().fc1.weight) == (part == "head")


def test_no_fine_tuning_evaluates_the_frozen_head():
    x, y = _data()
    model = _model()
    out, _ = FedBABUClient.evaluation_model(model, _evaluation("head", steps=0), None, TrainData(x, y), lambda m: evaluate(m, x, y))
    torch.testing.assert_close(flatten_module(out), flatten_module(_model()))


def test_the_node_fine_tunes_before_testing_and_reports_both_accuracies():
    node = Node.from_context(Context(run_id=1, node_id=5, node_config={"partition-id": 0, "num-partitions": 4}, state=RecordDict(),
                                     run_config=ExperimentConfig(model="dnn").to_run_config()))
    received = [v.clone() for v in node.model.state_dict().values()]
    plain = node.evaluate({})
    node.load(received)
    tuned = node.evaluate({**FedBABU().evaluation_config(), CLIENT_ALGORITHM: "fedbabu"})
    assert tuned[GLOBAL_ACCURACY] == plain["accuracy"] and tuned["loss"] < plain["loss"]


# --- the server ------------------------------------------------------------------------------------

def _named(body: float, head: float) -> dict[str, np.ndarray]:
    shapes = {"fc1.weight": (2, 3), "fc1.bias": (2,), "fc2.weight": (2, 2), "fc2.bias": (2,)}
    return {k: np.full(s, body if k.startswith("fc1") else head, dtype=np.float32) for k, s in shapes.items()}


def test_bodies_are_averaged_by_samples_and_the_head_stays_as_initialised():
    server = MethodServer(FedBABU(), clients_per_round=2)
    server.initialize(_named(0.0, 0.5))
    plan = server.plan_training(1, [1, 2])
    assert all(ins.config == {**ins.config, CLIENT_ALGORITHM: "fedbabu", HEAD_LAYERS: 1} for ins in plan)
    replies = [RawReply(cid, list(_named(body, 9.0).values()), list(_named(0, 0)), n, {"num-examples": n})
               for cid, body, n in ((1, 1.0, 1), (2, 4.0, 3))]  # clients that (wrongly) moved the head
    new = server.aggregate(1, [server.check(r) for r in replies])
    torch.testing.assert_close(new[:8], torch.full((8,), 3.25))  # 1 · 1/4 + 4 · 3/4
    torch.testing.assert_close(new[8:], torch.full((6,), 0.5))  # the initial head, never trained
    evals = server.plan_evaluation(1, [1, 2], 1.0)
    assert all(torch.equal(ins.model, new) and ins.config[FINETUNE_STEPS] == 20 and ins.config[FINETUNE_PART] == "head"
               and ins.config[CLIENT_ALGORITHM] == "fedbabu" for ins in evals)


def test_bad_hyperparameters_and_runs_are_refused():
    for bad, match in (({"finetune_part": "body"}, "finetune_part"), ({"finetune_lr": 0.0}, "finetune_lr"),
                       ({"finetune_steps": -1}, "finetune_steps"), ({"finetune_batch_size": 0}, "finetune_batch_size"),
                       ({"head_layers": 0}, "head_layers")):
        with pytest.raises(ValueError, match=f"{match} = .* is invalid"):
            FedBABU(**bad)
    with pytest.raises(ConfigError, match="model"):
        ExperimentConfig(method="fedbabu", model="mlr")
    with pytest.raises(ConfigError, match="init"):
        ExperimentConfig(method="fedbabu", model="dnn", init="zero")


# --- one whole run ---------------------------------------------------------------------------------

def test_short_run_as_recorded_fine_tuning_helps_and_beats_fedavg(short_runs, tmp_path):
    babu = short_runs("fedbabu")
    frozen = short_run("fedbabu", tmp_path, **{"fedbabu-finetune-steps": 0})
    assert babu["bmta"] > frozen["bmta"] + 0.2  # observed 0.862 with fine-tuning, 0.134 with the frozen head
    assert babu["bmta"] > short_runs("fedavg")["bmta"] + 0.3  # observed 0.862 vs 0.306
    assert_as_recorded("fedbabu", babu)
