"""FedGen (Zhu et al. 2021): the α/β schedule by hand, the client's steps against its whole loss written
out, the label counts it returns, a user's own loop, the server with fabricated replies (the generator
trained on the participants' heads, FedAvg of the models, the generator sent down), what it refuses, and
a short run (α = β = 0 is FedAvg, up to the order of float sums)."""

from __future__ import annotations

import fabricate as fb
import pytest
import torch
import torch.nn.functional as F
from batching import assert_together_is_one_by_one
from floats import assert_same_math, same_math
from flwr.app import RecordDict

from client_apps.own_loop import algorithm_for
from flower_pfl.engine.batched import _settings, unbatched
from flower_pfl.engine.client_algorithm import CLIENT_ALGORITHM, LR, SERVER_ROUND, ClientAlgorithm, TrainData, train_locally
from flower_pfl.engine.feature_generator import FeatureGenerator, decode_generator, encode_generator
from flower_pfl.engine.layout import ParamLayout, flatten_module
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.engine.minibatches import MinibatchStream
from flower_pfl.engine.reply_checks import RawReply, UpdateRejected
from flower_pfl.engine.wire import decode_flat, encode_vector, fingerprint
from flower_pfl.experiment.models import DNN, build_model
from flower_pfl.methods.fedgen import (
    ALPHA,
    BATCH,
    BETA,
    GENERATOR,
    HIDDEN,
    LABEL_COUNTS,
    NOISE_DIM,
    FedGen,
    FedGenClient,
    coefficient,
)

from .features import seeded_dnn, three_classes
from .runs import assert_as_recorded, short_run

C, D, NOISE, WIDTH = 3, 4, 2, 6  # classes, representation (DNN(5, 3, hidden=4)), generator noise and width


def _data():
    return three_classes(40, 5)


def _model(seed: int = 0) -> DNN:
    return seeded_dnn(5, C, D, seed)


def _generator() -> FeatureGenerator:
    torch.manual_seed(11)
    g = FeatureGenerator(NOISE, C, WIDTH, D)
    g.train()
    g(torch.tensor([0, 1, 2, 0]), torch.rand(4, NOISE))  # running statistics
    return g


def _config(alpha: float = 2.0, beta: float = 3.0, labels=(True, False, True)) -> dict:
    return {LR: 0.1, CLIENT_ALGORITHM: "fedgen", SERVER_ROUND: 4, ALPHA: alpha, BETA: beta, BATCH: 5, NOISE_DIM: NOISE,
            HIDDEN: WIDTH, GENERATOR: encode_generator(_generator(), torch.tensor(labels))}


def _train(model, config, steps=3, seed=1, algorithm=FedGenClient):
    x, y = _data()
    return train_locally(algorithm(model, config), model, TrainData(x, y), steps=steps, lr=0.1, batch_size=8,
                         generator=torch.Generator().manual_seed(seed))


def test_alpha_and_beta_decay_each_round_to_a_floor():
    assert coefficient(10.0, 0.98, 1) == 10.0
    assert coefficient(10.0, 0.98, 3) == pytest.approx(10.0 * 0.98 ** 2)
    assert coefficient(10.0, 0.5, 60) == 1e-4  # the floor
    assert coefficient(0.0, 0.98, 5) == 0.0  # 0 turns the term off


def test_each_step_descends_the_whole_loss_written_out():
    """The client's steps against SGD on ``CE + β KL(softmax(h(G(y))) ‖ softmax(f(x))) + (B̂/B) α CE(h(G(ŷ)), ŷ)``,
    the draws made as the client makes them (its generator seeded by its first minibatch and the round)."""
    config, (x, y) = _config(), _data()
    model, ref = _model(), _model()
    _, extras = _train(model, config)
    generator = _generator()
    generator.eval()
    stream = MinibatchStream(len(y), 8, torch.Generator().manual_seed(1))
    optimizer, rng, seen = torch.optim.SGD(ref.parameters(), lr=0.1), None, torch.zeros(C)
    for _ in range(3):
        idx = stream.next()
        xb, yb = x[idx], y[idx]
        seen += torch.bincount(yb, minlength=C)
        rng = rng or torch.Generator().manual_seed(fingerprint([xb, yb]) * 1_000_003 + 4)
        with torch.no_grad():
            target = F.softmax(ref.fc2(generator(yb, torch.rand(8, NOISE, generator=rng))), dim=1)
            drawn = torch.tensor([0, 2])[torch.randint(2, (5,), generator=rng)]  # the generator's classes only
            generated = generator(drawn, torch.rand(5, NOISE, generator=rng))
        logits = ref(xb)
        loss = (F.cross_entropy(logits, yb) + 3.0 * F.kl_div(F.log_softmax(logits, 1), target, reduction="batchmean")
                + 5 / 8 * 2.0 * F.cross_entropy(ref.fc2(generated), drawn))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert_same_math(flatten_module(model), flatten_module(ref))
    assert decode_flat(extras[LABEL_COUNTS], C).tolist() == seen.tolist() and seen.sum() == 24
    plain = _model()
    _train(plain, config, algorithm=ClientAlgorithm)
    assert not torch.allclose(flatten_module(model), flatten_module(plain), atol=1e-4)  # the generator's terms mattered


def test_without_a_generator_the_client_is_plain_sgd_that_counts_labels():
    model, plain = _model(), _model()
    _, extras = _train(model, {LR: 0.1, CLIENT_ALGORITHM: "fedgen"})
    _train(plain, {LR: 0.1}, algorithm=ClientAlgorithm)
    assert_same_math(flatten_module(model), flatten_module(plain))  # its own step: the same SGD, other float kernels
    assert extras[CLIENT_ALGORITHM] == "fedgen" and decode_flat(extras[LABEL_COUNTS], C).sum() == 24


def test_users_loop_matches_train_locally():
    x, y = _data()
    config = _config()
    ours, theirs = _model(), _model()
    _, extras = _train(ours, config, seed=3)
    step = algorithm_for(config, theirs, RecordDict(), torch.optim.SGD(theirs.parameters(), lr=0.1))
    their_extras = fb.user_loop(theirs, step, x, y, lr=0.1, batch_size=8, steps=3, seed=3)
    assert_same_math(flatten_module(ours), flatten_module(theirs))
    assert extras == their_extras


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="alpha, beta >= 0"):
        FedGenClient(_model(), _config(alpha=-1.0))
    with pytest.raises(ValueError, match="fedgen-beta"):
        FedGenClient(_model(), {k: v for k, v in _config().items() if k != BETA})
    with pytest.raises(ValueError, match="no class"):
        FedGenClient(_model(), _config(labels=(False, False, False)))
    with pytest.raises(ValueError, match="'fedgen-generator': expected"):
        FedGenClient(_model(), {**_config(), GENERATOR: b"\x00" * 8})
    for bad in ({"decay": 0.0}, {"decay": 1.5}, {"batch_size": 1}, {"alpha": -1.0}, {"steps": 0}, {"generator_lr": 0.0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            FedGen(**bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="linear head"):
        FedGen().setup(ParamLayout(("w",), ((3, 4),)), torch.zeros(12), torch.device("cpu"))


# --- the server, with fabricated replies -----------------------------------------------------------

def _arrays(value: float) -> dict:
    return {k: torch.full(t.shape, value).numpy() for k, t in _model().state_dict().items()}


def _reply(server: MethodServer, cid: int, model: DNN, n: int, counts) -> RawReply:
    a = {k: t.detach().numpy() for k, t in model.state_dict().items()}
    return server.check(RawReply(cid, list(a.values()), list(a), n, {}, {CLIENT_ALGORITHM: "fedgen",
                                                                        LABEL_COUNTS: encode_vector(torch.tensor(counts))}))


def test_server_trains_the_generator_on_the_heads_averages_the_models_and_sends_both():
    fedgen = FedGen(alpha=4.0, beta=2.0, decay=0.5, noise_dim=NOISE, hidden=WIDTH, steps=3, batch_size=6)
    server = MethodServer(fedgen, clients_per_round=2)
    server.initialize(_arrays(0.0))
    plan = server.plan_training(1, [1, 2])
    assert all(ins.config == {CLIENT_ALGORITHM: "fedgen"} for ins in plan)  # no generator yet
    untrained = {k: v.clone() for k, v in fedgen.generator.generator.state_dict().items()}
    first, second = _model(1), _model(2)
    replies = [_reply(server, 1, first, 10, [4.0, 4.0, 0.0]), _reply(server, 2, second, 30, [0.0, 2.0, 0.0])]
    server.aggregate(1, replies)
    assert torch.allclose(fedgen.model, (10 * flatten_module(first) + 30 * flatten_module(second)) / 40, atol=1e-6)  # FedAvg
    assert fedgen.generator.labels.tolist() == [1.0, 1.0, 0.0]  # the classes the participants hold
    assert not torch.equal(untrained["out.weight"], fedgen.generator.generator.out.weight)
    config = server.plan_training(2, [1])[0].config
    assert (config[ALPHA], config[BETA], config[BATCH], config[NOISE_DIM], config[HIDDEN]) == (2.0, 1.0, 6, NOISE, WIDTH)
    received = FeatureGenerator(NOISE, C, WIDTH, D)
    assert decode_generator(config[GENERATOR], received).tolist() == [True, True, False]
    assert torch.equal(received.out.weight, fedgen.generator.generator.out.weight)


def test_the_generator_learns_from_the_participants_heads_not_the_average():
    """Two rounds alike but for the heads the clients send: the generator differs, the averaged body not."""
    generators, rows = [], torch.arange(C * D, dtype=torch.float32).view(C, D) / 6 - 1
    for head_value in (1.0, -1.0):
        fedgen = FedGen(noise_dim=NOISE, hidden=WIDTH, steps=2, batch_size=4)
        server = MethodServer(fedgen, clients_per_round=2)
        server.initialize(_arrays(0.0))
        server.plan_training(1, [1, 2])
        models = [_model(1), _model(2)]
        with torch.no_grad():
            models[0].fc2.weight.copy_(head_value * rows)
            models[1].fc2.weight.copy_(-head_value * rows)  # the same average head either way
        server.aggregate(1, [_reply(server, 1, models[0], 10, [3.0, 0.0, 1.0]), _reply(server, 2, models[1], 10, [0.0, 3.0, 1.0])])
        generators.append(fedgen.generator.generator.out.weight.detach().clone())
    assert not torch.allclose(generators[0], generators[1])


@pytest.mark.parametrize("extras, reason", [({}, "lacks"), ({LABEL_COUNTS: b"\x00" * 8}, "expected 3"),
                                            ({LABEL_COUNTS: encode_vector(torch.tensor([1.0, float("inf"), 0.0]))}, "NaN or Inf"),
                                            ({LABEL_COUNTS: encode_vector(torch.tensor([2.0, -1.0, 0.0]))}, "whole numbers"),
                                            ({LABEL_COUNTS: encode_vector(torch.tensor([0.5, 1.0, 0.0]))}, "whole numbers"),
                                            ({LABEL_COUNTS: encode_vector(torch.zeros(3))}, "at least one")])
def test_server_refuses_bad_label_counts(extras, reason):
    server = MethodServer(FedGen(), clients_per_round=1)
    server.initialize(_arrays(0.0))
    server.plan_training(1, [1])
    a = _arrays(1.0)
    with pytest.raises(UpdateRejected, match=reason):
        server.check(RawReply(1, list(a.values()), list(a), 10, {}, {CLIENT_ALGORITHM: "fedgen", **extras}))


# --- a whole run ----------------------------------------------------------------------------------

def test_short_run_as_recorded_and_without_alpha_and_beta_it_is_fedavg(short_runs, tmp_path):
    run, fedavg = short_runs("fedgen"), short_runs("fedavg")
    plain = short_run("fedgen", tmp_path, **{"fedgen-alpha": 0.0, "fedgen-beta": 0.0})
    assert plain["train_loss"] == same_math(fedavg["train_loss"])  # Flower's FedAvg: the same mean, another sum
    assert run["train_loss"][0] == pytest.approx(fedavg["train_loss"][0])  # round 1: no generator yet
    assert run["train_loss"][1:] != pytest.approx(fedavg["train_loss"][1:], rel=1e-3)  # then the generator's terms change training
    assert_as_recorded("fedgen", run)


# --- a round's clients as one computation ---------------------------------------------------------

def _round_config(model, with_generator: bool) -> dict:
    """The server's instruction for ``model`` (round 4, the generator trained on two classes; round 1: none)."""
    if not with_generator:
        return {LR: 0.05, CLIENT_ALGORITHM: "fedgen", SERVER_ROUND: 1}
    head = model.fc2
    torch.manual_seed(11)
    generator = FeatureGenerator(NOISE, head.out_features, WIDTH, head.in_features)
    generator.train()
    generator(torch.tensor([0, 1, 2, 0]), torch.rand(4, NOISE))  # running statistics
    return {LR: 0.05, CLIENT_ALGORITHM: "fedgen", SERVER_ROUND: 4, ALPHA: 2.0, BETA: 3.0, BATCH: 5, NOISE_DIM: NOISE,
            HIDDEN: WIDTH, GENERATOR: encode_generator(generator, torch.tensor([True, False, True]))}


@pytest.mark.parametrize("with_generator", [True, False], ids=["generator", "round-1"])
@pytest.mark.parametrize("name", ["dnn", "dnn-bn"])
def test_a_rounds_clients_train_together_as_one_by_one(name, with_generator):
    """Each client's draws from its own generator, the same as one by one; the label counts exactly the same."""
    model = build_model(name, (6,), 3)
    assert unbatched(FedGenClient, model) is None
    config = _round_config(model, with_generator)
    assert_together_is_one_by_one(model, (6,), lambda m, i: FedGenClient(m, config))


def test_clients_sent_other_generators_train_apart():
    model = build_model("dnn", (6,), 3)
    config = _round_config(model, True)
    other = {**config, GENERATOR: encode_generator(FeatureGenerator(NOISE, C, WIDTH, 20).eval(), torch.tensor([True, True, False]))}
    assert_together_is_one_by_one(model, (6,), lambda m, i: FedGenClient(m, other if i % 2 else config))
    assert _settings(FedGenClient(model, config)) != _settings(FedGenClient(model, other))
