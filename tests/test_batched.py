"""A round's clients trained as one computation (``flower_pfl.engine.batched``): the same minibatches
and models as training them one by one (``train_locally``), clients of other batch sizes or settings
in groups of their own, what cannot be batched named with its reason, and the in-process grid's
replies and report. Every registry entry's whole run, batched against its recording:
``tests/methods/test_recorded_runs.py``."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from batching import SIZES, assert_together_is_one_by_one, clients, one_by_one, together
from floats import ABS, REL, assert_same_math, same_math

from flower_pfl.engine.batched import CPU_CONVOLUTIONS, DROPOUT, RECURRENT, _bound, unbatched
from flower_pfl.engine.client_algorithm import LR, PROXIMAL_MU, ClientAlgorithm, Proximal, TrainData
from flower_pfl.experiment.models import DNN, build_model
from flower_pfl.experiment.models.base import ModelSettings
from flower_pfl.methods.ditto import DittoClient
from flower_pfl.methods.igfl import IGFLCorrection


def _clients(seed: int = 0, model: torch.nn.Module | None = None,
             shape: tuple[int, ...] = (6,)) -> tuple[torch.nn.Module, list[TrainData], list[list[torch.Tensor]]]:
    torch.manual_seed(seed)
    model = model if model is not None else DNN(6, 3, 5)
    return (model, *clients(model, shape, seed=seed))


_one_by_one, _together = one_by_one, together


@pytest.mark.parametrize("make", [
    lambda m, i: ClientAlgorithm(m, {LR: 0.05}),
    lambda m, i: Proximal(m, {LR: 0.05, PROXIMAL_MU: 2.0}),
    lambda m, i: Proximal(m, {LR: 0.05, PROXIMAL_MU: 0.5 + i}),  # another μ each: groups of their own
], ids=["sgd", "proximal", "proximal-other-mu-each"])
def test_together_is_one_by_one_on_the_same_minibatches(make):
    model, datas, starts = _clients()
    for (a, loss_a, extras_a), (b, loss_b, extras_b) in zip(_one_by_one(model, datas, starts, make),
                                                            _together(model, datas, starts, make)):
        for x, y in zip(a, b):
            assert_same_math(y, x)
        assert loss_b == same_math(loss_a) and extras_b == extras_a
    moved = _together(model, datas, starts, make)[0][0]
    assert not torch.allclose(moved[0], starts[0][0], atol=1e-3)  # it trained


def test_a_convolutional_model_batches_to_the_same_models_where_it_is_batched():
    """On CUDA a CNN's clients train together (one grouped convolution per layer); the math is checked
    here, on the CPU, where the engine trains them one by one (``CPU_CONVOLUTIONS``)."""
    torch.manual_seed(3)
    model, datas, starts = _clients(3, build_model("cnn", (1, 28, 28), 3), (1, 28, 28))
    make = lambda m, i: Proximal(m, {LR: 0.05, PROXIMAL_MU: 0.1})
    for (a, loss_a, _), (b, loss_b, _) in zip(_one_by_one(model, datas, starts, make), _together(model, datas, starts, make)):
        for x, y in zip(a, b):  # a convolution's weight gradient sums 20 x 24 x 24 products an element: sqrt of
            # 11,520 terms, ~100x the reordering error of the short sums ``floats.ABS`` is made for
            torch.testing.assert_close(y, x, rtol=REL, atol=100 * ABS)
        assert loss_b == same_math(loss_a)
    assert unbatched(Proximal, model) == CPU_CONVOLUTIONS


def test_an_algorithm_that_replaces_the_gradient_and_keeps_state_batches_too():
    """IGFL-C: the gradient replaced by its corrected one, each client's previous delta its own."""
    from flwr.app import RecordDict

    from client_apps.own_loop import RecordState
    from flower_pfl.engine.wire import encode_vector

    model, datas, starts = _clients(1)
    dim = sum(p.numel() for p in model.parameters())
    states = [RecordState(RecordDict()) for _ in SIZES]
    for i, s in enumerate(states):  # another previous delta each
        s["igfl-delta"] = [torch.full_like(p, 0.01 * (i + 1)) for p in model.parameters()]
    config = {LR: 0.05, "local-steps": 7, "igfl-participants": 4, "igfl-global-delta": encode_vector(torch.full((dim,), 0.02))}
    one = _one_by_one(model, datas, starts, lambda m, i: IGFLCorrection(m, config, copy.deepcopy(states[i])))
    two = _together(model, datas, starts, lambda m, i: IGFLCorrection(m, config, copy.deepcopy(states[i])))
    for (a, _, _), (b, _, _) in zip(one, two):
        for x, y in zip(a, b):
            assert_same_math(y, x)


def test_batch_normalization_s_statistics_are_each_client_s_own():
    """Each client's running statistics move with its own minibatches, as one by one."""
    model = build_model("dnn-bn", (6,), 3)
    assert unbatched(Proximal, model) is None
    assert_together_is_one_by_one(model, (6,), lambda m, i: Proximal(m, {LR: 0.05, PROXIMAL_MU: 0.3}))
    datas, starts = clients(model, (6,))
    trained = together(model, datas, starts, lambda m, i: ClientAlgorithm(m, {LR: 0.05}))
    means = [dict(zip(model.state_dict(), t))["bn1.running_mean"] for t, _, _ in trained]
    assert not torch.allclose(means[0], means[2])


@pytest.mark.parametrize("model", ["dnn", "dnn-bn"])
def test_an_algorithm_with_its_own_step_batches_a_second_model(model):
    """Ditto: the personal model (its own running statistics too) is a second stacked state."""
    from flwr.app import RecordDict

    from client_apps.own_loop import RecordState

    built = build_model(model, (6,), 3)
    assert unbatched(DittoClient, built) is None
    assert_together_is_one_by_one(built, (6,), lambda m, i: DittoClient(m, {LR: 0.05, "ditto-lambda": 0.5 + i},
                                                                      RecordState(RecordDict())))


@pytest.mark.parametrize("model", ["dnn", "dnn-bn"])
def test_a_round_s_clients_evaluate_as_one_computation_as_one_by_one(model):
    """Each client's model on its own test split, the splits of other sizes (one empty) and in several chunks."""
    from flower_pfl.engine.evaluation import evaluate, evaluate_together

    built = build_model(model, (6,), 3)
    torch.manual_seed(5)
    states = [[t + 0.1 * i * torch.randn_like(t) if t.is_floating_point() else t for t in built.state_dict().values()]
              for i in range(4)]
    states.append([t.clone() for t in states[1]])  # two clients holding one model: its forward passes shared
    tests = [(torch.randn(n, 6), torch.randint(0, 3, (n,))) for n in (9, 30, 0, 17, 11)]
    together = evaluate_together(built, states, tests, batch_size=20)  # 5 samples a client per chunk
    for state, (x, y), got in zip(states, tests, together):
        m = copy.deepcopy(built)
        _load_state(m, state)
        want = evaluate(m, x, y)
        assert got.num_examples == want.num_examples and got.accuracy == want.accuracy
        assert got.loss == same_math(want.loss)
    assert len({r.accuracy for r in together}) > 1


def test_a_node_s_clients_evaluated_together_get_what_each_gets_on_its_own():
    """Clients that evaluate one received model as it is share its load and copy; a new client between them
    fine-tunes it first, and the client after it evaluates the model as received again."""
    from flwr.app import ConfigRecord, Context, RecordDict

    from client_apps.app import MODEL_FINGERPRINT, Node, _evaluate, evaluate_round
    from flower_pfl.engine.client_algorithm import BATCH_SIZE, FINETUNE_STEPS, NEW_CLIENT, SERVER_ROUND
    from flower_pfl.experiment.config import ExperimentConfig
    from flower_pfl.run.cost import NODE_PEAK_MEMORY
    from strategies.arrays import numpy_record

    run_config = ExperimentConfig(model="dnn", val_fraction=0.25).to_run_config()
    contexts = [Context(run_id=1, node_id=1, node_config={"partition-id": i, "num-partitions": 5}, state=RecordDict(),
                        run_config=run_config) for i in range(5)]
    model = Node.from_context(contexts[0]).model
    torch.manual_seed(3)
    sent = numpy_record({k: (v + 0.3 * torch.randn_like(v)).numpy() for k, v in model.state_dict().items()})
    plain = ConfigRecord({SERVER_ROUND: 4})
    new = ConfigRecord({SERVER_ROUND: 4, NEW_CLIENT: True, FINETUNE_STEPS: 3, LR: 0.5, BATCH_SIZE: 8})
    contents = [RecordDict({"arrays": sent, "config": config}) for config in (plain, plain, new, plain, plain)]
    replies, why = evaluate_round(contents, contexts)
    assert why == [None] * 5
    got = [dict(r["metrics"]) for r in replies]
    alone = [dict(_evaluate(c, x)["metrics"]) for c, x in zip(contents, contexts)]
    for g, a in zip(got, alone):
        assert g.pop("loss") == same_math(a.pop("loss")) and g.pop("val-loss") == same_math(a.pop("val-loss"))
        del g[NODE_PEAK_MEMORY], a[NODE_PEAK_MEMORY]
        assert g == a
    assert len({g[MODEL_FINGERPRINT] for g in got}) == 1 and [g["partition-id"] for g in got] == [0, 1, 2, 3, 4]


def test_one_model_evaluated_alone_runs_in_chunks_its_activations_bound(monkeypatch):
    """A small model's samples go through in one forward pass, a model whose activations would pass
    ``CHUNK_BYTES`` in chunks of ``batch_size``: the same figures either way."""
    from flower_pfl.engine import evaluation
    from flower_pfl.engine.memory import activation_bytes

    built = build_model("dnn", (6,), 3)
    state = [t.clone() for t in built.state_dict().values()]
    tests = [(torch.randn(n, 6), torch.randint(0, 3, (n,))) for n in (9, 30, 17)]
    passes: list[int] = []
    forward = evaluation.Functional.__call__
    monkeypatch.setattr(evaluation.Functional, "__call__", lambda self, st, x: passes.append(len(x)) or forward(self, st, x))
    whole = evaluation.evaluate_together(built, [state] * 3, tests, batch_size=8)
    assert passes == [56]  # 56 samples of a few hundred bytes each: one pass
    passes.clear()
    monkeypatch.setattr(evaluation, "CHUNK_BYTES", 10 * (6 * 4 + activation_bytes(built, tests[0][0][0])))
    chunked = evaluation.evaluate_together(built, [state] * 3, tests, batch_size=8)
    assert passes == [10] * 5 + [6]  # as many samples as CHUNK_BYTES holds, more than batch_size
    assert [(r.accuracy, r.num_examples) for r in chunked] == [(r.accuracy, r.num_examples) for r in whole]
    assert [r.loss for r in chunked] == [same_math(r.loss) for r in whole]


def test_a_round_s_evaluation_stacks_a_bounded_share_of_the_models_at_once(tmp_path, monkeypatch):
    import client_apps.app as capp
    from flower_pfl.engine import evaluation

    stacks: list[int] = []
    real = evaluation.evaluate_together
    monkeypatch.setattr(capp, "evaluate_together", lambda m, states, tests: stacks.append(len(states)) or real(m, states, tests))
    whole = _summary(tmp_path / "a", method="fedmcsa", figures=False)
    monkeypatch.setattr(capp, "STACKED_BYTES", 2 * sum(t.numel() * 4 for t in DNN(60, 10).state_dict().values()))
    stacks.clear()
    bounded = _summary(tmp_path / "b", method="fedmcsa", figures=False)
    assert stacks == [2, 2] * 2  # 4 clients, two at a time, in both evaluated rounds
    assert bounded["final_accuracy"] == whole["final_accuracy"] and bounded["clients_evaluated_together"] == 8


def _load_state(model: torch.nn.Module, state: list[torch.Tensor]) -> None:
    with torch.no_grad():
        for t, v in zip(model.state_dict().values(), state):
            t.copy_(v)


def test_a_step_s_gradients_are_the_same_for_one_client_and_under_vmap():
    """``Functional.grad`` runs through autograd for one client and through torch.func under vmap: the same
    gradients (of the state and of an extra tensor), loss, updated running statistics and aux; zeros where the
    loss does not depend on an input."""
    from torch.func import vmap

    from flower_pfl.engine.functional import Functional

    model = build_model("dnn-bn", (6,), 3)
    f, state = Functional(model), Functional(model).state()
    x, y, shift = torch.randn(8, 6), torch.randint(0, 3, (8,)), torch.randn(3)

    def loss_of(s, extra, unused):
        logits = f(s, x) + extra
        return torch.nn.functional.cross_entropy(logits, y), logits.sum()

    def step(s, extra, unused):
        return f.grad(loss_of, s, extra, unused, has_aux=True)

    one = step(state, shift, [torch.ones(2)])
    many = vmap(step)([t[None] for t in state], shift[None], [torch.ones(1, 2)])
    flatten = lambda out, i=None: [t if i is None else t[i] for part in (out[0], *out[1], [out[2]], out[3], [out[4]])
                                   for t in (part if isinstance(part, list | tuple) else [part])]
    for a, b in zip(flatten(one), flatten(many, 0)):
        assert_same_math(b.float(), a.float())
    assert torch.equal(one[1][1][0], torch.zeros(2)) and not torch.equal(one[3][4], state[4])  # unused; statistics moved


def test_an_attribute_compared_by_its_address_is_refused_not_left_to_split_the_round():
    class Careless(ClientAlgorithm):
        def __init__(self, model, config, state=None):
            super().__init__(model, config, state)
            self.helper = object()  # every client's own: each would train in a group of its own

    model, datas, starts = _clients()
    with pytest.raises(TypeError, match="Careless.helper is a object compared by its address"):
        together(model, datas, starts, lambda m, i: Careless(m, {LR: 0.05}))


def test_what_cannot_be_batched_is_named():
    assert unbatched(ClientAlgorithm, DNN(6, 3, 5)) is None and unbatched(Proximal, DNN(6, 3, 5)) is None

    class OwnLoop(ClientAlgorithm):
        def train_step(self, model, next_batch, lr):
            return 0.0

    assert "train_step" in unbatched(OwnLoop, DNN(6, 3, 5))


def test_a_client_s_own_tensors_are_bound_only_inside():
    model, _, _ = _clients()
    algorithm = Proximal(model, {LR: 0.1, PROXIMAL_MU: 1.0})
    anchor = algorithm.anchor
    with _bound(algorithm, {"anchor": [torch.zeros(1)]}):
        assert algorithm.anchor[0].shape == (1,)
    assert algorithm.anchor is anchor


# --- in process: the grid trains a round's clients together and says so ---------------------------------

def _summary(tmp_path, **settings) -> dict:
    from server_apps.inprocess import run_in_process

    folder = run_in_process({"num-rounds": 2, "clients-per-round": 3, "local-steps": 3, "eval-every": 2, "model": "dnn",
                             "output-dir": str(tmp_path), **settings}, num_clients=4)
    return json.loads((folder / "summary.json").read_text())


def test_an_in_process_run_says_how_its_clients_trained(tmp_path):
    from client_apps.app import ONE_BY_ONE

    batched = _summary(tmp_path / "a", method="fedmcsa")
    assert (batched["clients_trained_together"], batched["clients_trained_one_by_one"]) == (6, 0)
    assert (batched["clients_evaluated_together"], batched["clients_evaluated_one_by_one"]) == (8, 0)  # rounds 0 and 2
    off = _summary(tmp_path / "b", method="fedmcsa", **{"batch-clients": False})
    assert (off["clients_trained_together"], off["clients_trained_one_by_one"]) == (0, 6)
    assert off["one_by_one_because"] == {ONE_BY_ONE: 6} and off["evaluated_one_by_one_because"] == {ONE_BY_ONE: 8}
    assert (off["clients_evaluated_together"], off["clients_evaluated_one_by_one"]) == (0, 8)
    assert off["final_accuracy"] == batched["final_accuracy"] and off["final_accuracy_std"] == same_math(batched["final_accuracy_std"])
    assert off["bmta"] == same_math(batched["bmta"])
    legacy = _summary(tmp_path / "d", method="fedmcsa", api="legacy")  # one node per client, each message its own
    assert "clients_trained_together" not in legacy and legacy["federation_clients"] == 4


def test_a_batched_run_repeats_to_the_last_bit(tmp_path):
    """Same seed, same numbers, with a round's clients as one computation too (in process)."""
    from local_runs import numbers

    from server_apps.inprocess import run_in_process

    settings = {"method": "scaffold", "num-rounds": 3, "clients-per-round": 3, "local-steps": 3, "eval-every": 1,
                "model": "dnn"}
    first, second = (run_in_process({**settings, "output-dir": str(tmp_path / name)}, num_clients=5) for name in "ab")
    assert json.loads((first / "summary.json").read_text())["clients_trained_together"] == 9
    assert numbers(first) == numbers(second)


def test_recurrent_and_dropout_models_train_one_by_one_and_say_why():
    lstm = build_model("char-lstm", (10,), 5, kind="tokens", vocab_size=20, settings=ModelSettings(width=0.05))
    assert unbatched(ClientAlgorithm, lstm) == RECURRENT
    dropout = build_model("textcnn", (10,), 3, kind="tokens", vocab_size=20, settings=ModelSettings(dropout=0.5))
    assert unbatched(ClientAlgorithm, dropout) in (DROPOUT, CPU_CONVOLUTIONS)
    assert unbatched(ClientAlgorithm, build_model("vgg11", (3, 32, 32), 3, settings=ModelSettings(width=0.05, dropout=0.5))) in (
        DROPOUT, CPU_CONVOLUTIONS)
    assert unbatched(ClientAlgorithm, build_model("mobilenetv2", (3, 32, 32), 3, settings=ModelSettings(width=0.1))) == CPU_CONVOLUTIONS
    transformer = build_model("transformer", (10,), 3, kind="tokens", vocab_size=20, text_embed_dim=8, text_heads=2)
    assert unbatched(ClientAlgorithm, transformer) is None
    with_dropout = build_model("transformer", (10,), 3, kind="tokens", vocab_size=20, text_embed_dim=8, text_heads=2,
                               settings=ModelSettings(dropout=0.1))
    assert unbatched(ClientAlgorithm, with_dropout) == DROPOUT


@pytest.mark.parametrize("name, keys, steps", [
    ("resnet18", {}, 2),
    ("resnet18", {"resnet_norm": "group"}, 4),
    ("mobilenetv2", {}, 1),
], ids=["resnet18-batch-norm", "resnet18-group-norm", "mobilenetv2"])
def test_the_image_models_batch_to_the_same_models_where_they_are_batched(name, keys, steps):
    """On a GPU a ResNet's or MobileNetV2's clients train together, each with its own running statistics; the math
    is checked here on the CPU (where convolutions train one by one), on 16x16 images at a small step. A few steps
    only: these narrow nets amplify float rounding (MobileNetV2 trained one by one on one and on two threads moves
    apart by 60x this tolerance within 4 steps; ResNet-18 with batch norm passes it after 3), so more steps would
    test the rounding, not the engine."""
    model = build_model(name, (3, 16, 16), 3, settings=ModelSettings(width=0.125), seed=0, **keys)
    datas, starts = clients(model, (3, 16, 16))
    make = lambda m, i: Proximal(m, {LR: 0.005, PROXIMAL_MU: 0.1})
    for (a, loss_a, _), (b, loss_b, _) in zip(one_by_one(model, datas, starts, make, steps, 0.005),
                                              together(model, datas, starts, make, steps, 0.005)):
        for x, y in zip(a, b):  # deep convolutions: the CNN test's tolerance
            torch.testing.assert_close(y, x, rtol=REL, atol=100 * ABS)
        assert loss_b == same_math(loss_a)


@pytest.mark.filterwarnings("ignore:There is a performance drop")  # vmap's fallback for the CPU's attention kernel
def test_a_transformer_batches_to_the_same_models_as_one_by_one():
    torch.manual_seed(4)
    model = build_model("transformer", (10,), 3, kind="tokens", vocab_size=20, text_embed_dim=8, text_heads=2, text_layers=1)
    datas = [TrainData(torch.randint(1, 20, (n, 10)), torch.randint(0, 3, (n,))) for n in SIZES]
    starts = [[t + 0.01 * i for t in model.state_dict().values()] for i in range(len(SIZES))]
    make = lambda m, i: Proximal(m, {LR: 0.05, PROXIMAL_MU: 0.1})
    for (a, loss_a, _), (b, loss_b, _) in zip(_one_by_one(model, datas, starts, make), _together(model, datas, starts, make)):
        for x, y in zip(a, b):
            assert_same_math(y, x)
        assert loss_b == same_math(loss_a)


def test_the_batched_cross_entropy_is_torch_s_to_the_bit_and_falls_back_where_it_differs():
    """``cross_entropy`` gives ``F.cross_entropy``'s bits under vmap, values and gradients alike; other
    arguments, shapes and soft targets go to ``F.cross_entropy`` itself."""
    import torch.nn.functional as F
    from torch.func import vmap

    from flower_pfl.engine.batched import cross_entropy

    g = torch.Generator().manual_seed(3)
    for clients_, batch, classes, features in ((1, 1, 2, 1), (7, 20, 10, 60), (4, 33, 62, 8)):
        w = (3 * torch.randn(clients_, classes, features, generator=g)).requires_grad_(True)
        x, y = torch.randn(clients_, batch, features, generator=g), torch.randint(0, classes, (clients_, batch), generator=g)
        ours = vmap(lambda w, x, y: cross_entropy(x @ w.T, y))(w, x, y)
        torch_s = vmap(lambda w, x, y: F.cross_entropy(x @ w.T, y))(w, x, y)
        assert torch.equal(ours, torch_s)
        assert torch.equal(torch.autograd.grad(ours.sum(), w)[0], torch.autograd.grad(torch_s.sum(), w)[0])
    logits, labels = torch.randn(5, 3, generator=g), torch.tensor([0, 2, 1, 1, 0])
    assert cross_entropy(logits, labels) == pytest.approx(float(F.cross_entropy(logits, labels)))
    soft = torch.softmax(torch.randn(5, 3, generator=g), 1)
    assert torch.equal(cross_entropy(logits, soft), F.cross_entropy(logits, soft))  # probabilities as targets
    assert torch.equal(cross_entropy(logits, labels, reduction="sum"), F.cross_entropy(logits, labels, reduction="sum"))
    assert torch.equal(cross_entropy(logits, labels, label_smoothing=0.1), F.cross_entropy(logits, labels, label_smoothing=0.1))
