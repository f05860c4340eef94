"""FedFomo: the first-order weights and the combination by hand, the client algorithm on the package's
loop (its fixed validation part held out in ``begin``), the server's ε-greedy choice by affinity and its affinity updates with fabricated replies,
the reply checks, and a short whole run."""

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import RecordDict

from client_apps.own_loop import algorithm_for
from flower_pfl.engine.client_algorithm import (
    BATCH_SIZE,
    CLIENT_ALGORITHM,
    LOCAL_STEPS,
    LR,
    SERVER_ROUND,
    ClientAlgorithm,
    TrainData,
    train_locally,
)
from flower_pfl.engine.layout import flatten_module, load_flat_
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.engine.minibatches import MinibatchStream
from flower_pfl.engine.reply_checks import RawReply, UpdateRejected
from flower_pfl.engine.wire import decode_flat, encode_vector
from flower_pfl.experiment.models import MLR
from flower_pfl.methods.fedfomo import (
    DOWNLOADS,
    SLOTS,
    VAL_FRACTION,
    VAL_SEED,
    WEIGHTS,
    FedFomo,
    FedFomoClient,
    first_order_weights,
    fomo_update,
    validation_split,
)

from .runs import assert_as_recorded

D = 8  # fc.weight (2, 3) + fc.bias (2)


# --- 1. the math, by hand --------------------------------------------------------------------------

def test_first_order_weights_by_hand():
    """w_n = (L(θ_i) − L(θ_n)) / ||θ_n − θ_i||; a model equal to the client's own gets 0."""
    own = torch.tensor([0.0, 0.0])
    others = torch.tensor([[3.0, 4.0], [1.0, 0.0], [0.0, 0.0]])
    w = first_order_weights(1.0, torch.tensor([0.5, 1.5, 0.25]), own, others)
    torch.testing.assert_close(w, torch.tensor([0.5 / 5, -0.5 / 1, 0.0]))


def test_combination_by_hand():
    """θ_i + Σ_n (max(w_n, 0) / Σ max(w, 0)) (θ_n − θ_i): negative weights drop out, no positive one keeps θ_i."""
    own = torch.tensor([1.0, 1.0])
    others = torch.tensor([[3.0, 1.0], [1.0, 5.0], [9.0, 9.0]])
    torch.testing.assert_close(fomo_update(own, others, torch.tensor([1.0, 3.0, -2.0])), torch.tensor([1.5, 4.0]))
    torch.testing.assert_close(fomo_update(own, others, torch.tensor([-1.0, 0.0, -2.0])), own)
    torch.testing.assert_close(fomo_update(own, others[:0], torch.zeros(0)), own)


# --- 2. the client algorithm ---------------------------------------------------------------------------

def _data():
    x = torch.randn(40, 3, generator=torch.Generator().manual_seed(0))
    return x, (x[:, 1] > 0).long()


def _config(others: torch.Tensor, slots: int = 3, steps: int = 5) -> dict:
    return {CLIENT_ALGORITHM: "fedfomo", LR: 0.1, LOCAL_STEPS: steps, BATCH_SIZE: 8, SLOTS: slots, VAL_FRACTION: 0.2,
            DOWNLOADS: encode_vector(others.flatten())}


def _held_out(n: int, fraction: float, seed: int):
    """The validation and training indices, by hand: the first round(fraction · n) of the permutation
    seeded by SeedSequence([seed, n]), and the rest."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(int(np.random.SeedSequence([seed, n]).generate_state(1)[0])))
    k = round(fraction * n)
    return perm[:k].sort().values, perm[k:].sort().values


def test_client_combines_on_its_validation_part_then_trains_on_the_rest():
    x, y = _data()
    torch.manual_seed(1)
    model = MLR(3, 2)
    own = flatten_module(model)
    others = torch.stack([own + 0.5, own - 0.3 * torch.arange(D, dtype=torch.float32) / D])
    step = FedFomoClient(model, {**_config(others), VAL_SEED: 7})
    _, extras = train_locally(step, model, TrainData(x, y), steps=5, lr=0.1, batch_size=8,
                              generator=torch.Generator().manual_seed(4))

    ref = MLR(3, 2)
    val, train = _held_out(40, 0.2, 7)  # 8 validation examples, 32 training ones

    def loss_of(vector):
        load_flat_(ref, vector)
        with torch.no_grad():
            return float(F.cross_entropy(ref(x[val]), y[val]))

    w = torch.tensor([(loss_of(own) - loss_of(o)) / float((o - own).norm()) for o in others])
    load_flat_(ref, fomo_update(own, others, w))
    optimizer = torch.optim.SGD(ref.parameters(), lr=0.1)
    stream = MinibatchStream(32, 8, torch.Generator().manual_seed(4))  # the round's generator, untouched by the split
    xt, yt = x[train], y[train]
    for _ in range(5):
        idx = stream.next()
        optimizer.zero_grad()
        F.cross_entropy(ref(xt[idx]), yt[idx]).backward()
        optimizer.step()
    torch.testing.assert_close(flatten_module(model), flatten_module(ref), atol=1e-6, rtol=0)
    returned = decode_flat(extras[WEIGHTS], 3)
    torch.testing.assert_close(returned[:2], w, atol=1e-6, rtol=0)
    assert returned[2] == 0  # padded to M


def test_the_validation_part_is_disjoint_from_training_and_the_same_every_round():
    x, y = _data()
    val, train = validation_split(40, 0.2, 7)
    assert len(val) == 8 and len(train) == 32 and not set(val.tolist()) & set(train.tolist())
    assert sorted(val.tolist() + train.tolist()) == list(range(40))
    assert all(torch.equal(a, b) for a, b in zip((val, train), _held_out(40, 0.2, 7)))
    for rnd in (1, 2, 9):  # another round, another received model and other downloads: the same split
        torch.manual_seed(rnd)
        model = MLR(3, 2)
        step = FedFomoClient(model, {**_config(torch.randn(2, D)), VAL_SEED: 7, SERVER_ROUND: rnd})
        kept = step.begin(model, TrainData(x, y))
        assert torch.equal(kept.x, x[train]) and torch.equal(kept.y, y[train])
        held, _ = step.split(TrainData(x, y))
        assert torch.equal(held.x, x[val])
    assert not torch.equal(validation_split(40, 0.2, 8)[0], val)  # another run seed, another split
    assert [len(v) for v, _ in (validation_split(n, 0.2, 0) for n in (1, 2, 3, 10))] == [0, 1, 1, 2]  # at least 1, leaving 1


def test_without_downloads_the_client_is_plain_local_sgd_on_its_training_part():
    x, y = _data()
    torch.manual_seed(1)
    model = MLR(3, 2)
    plain = copy.deepcopy(model)
    _, extras = train_locally(FedFomoClient(model, _config(torch.zeros(0))), model, TrainData(x, y), steps=3, lr=0.1,
                              batch_size=8, generator=torch.Generator().manual_seed(2))
    _, train = validation_split(40, 0.2, 0)  # no seed sent: 0
    train_locally(ClientAlgorithm(plain, {}), plain, TrainData(x[train], y[train]), steps=3, lr=0.1, batch_size=8,
                  generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(flatten_module(model), flatten_module(plain))
    assert torch.equal(decode_flat(extras[WEIGHTS], 3), torch.zeros(3))


def test_the_client_refuses_more_models_than_its_slots():
    model = MLR(3, 2)
    with pytest.raises(ValueError, match="at most 1 models"):
        FedFomoClient(model, _config(torch.zeros(2, D), slots=1))


def test_not_a_hook_on_a_users_loop():
    with pytest.raises(ValueError, match="client_apps.app"):
        algorithm_for(_config(torch.zeros(0)), MLR(3, 2), RecordDict())


# --- 3. the server, with fabricated replies ---------------------------------------------------------

def _arrays(value: float) -> dict[str, np.ndarray]:
    return {"fc.weight": np.full((2, 3), value, np.float32), "fc.bias": np.full(2, value, np.float32)}


def _reply(cid, value: float, weights) -> RawReply:
    arrays = _arrays(value)
    return RawReply(cid, list(arrays.values()), list(arrays), 10, {}, {WEIGHTS: encode_vector(torch.tensor(weights))})


def _downloads(ins) -> torch.Tensor:
    data = ins.config[DOWNLOADS]
    return decode_flat(data, len(data) // 4).view(-1, D)


def test_server_picks_by_affinity_and_adds_the_weights():
    server = MethodServer(FedFomo(models=2, epsilon=0.0), clients_per_round=4, seed=3)
    server.initialize(_arrays(0.0))
    plan = server.plan_training(1, [1, 2, 3, 4])
    assert all(ins.config[DOWNLOADS] == b"" and ins.config[SLOTS] == 2 for ins in plan)  # nobody has trained yet
    assert all(ins.config[VAL_SEED] == 3 and ins.config[VAL_FRACTION] == 0.2 for ins in plan)  # the run's seed fixes the split
    assert all(ins.config[CLIENT_ALGORITHM] == "fedfomo" for ins in plan)
    server.aggregate(1, [server.check(_reply(c, float(c), [0.0, 0.0])) for c in (1, 2, 3, 4)])
    plan = {ins.client_id: ins for ins in server.plan_training(2, [1, 2, 3, 4])}
    assert torch.all(plan[1].model == 1.0)  # its own stored model
    sent = server.method._downloads
    assert all(len(sent[c]) == 2 and c not in sent[c] for c in sent)
    for c in sent:  # the downloads are those clients' stored models, in order
        torch.testing.assert_close(_downloads(plan[c]), torch.stack([torch.full((D,), float(n)) for n in sent[c]]))
    server.aggregate(2, [server.check(_reply(c, float(c), [0.5, -0.25])) for c in (1, 2, 3, 4)])
    first, second = sent[1]
    assert server.method.affinity[1] == {first: 0.5, second: -0.25}  # p_{i,n} += w_n
    server.plan_training(3, [1, 2, 3, 4])
    assert server.method._downloads[1][0] == first  # the largest affinity first (ε = 0)
    assert server.method.trained == {1: 2, 2: 2, 3: 2, 4: 2}


def test_epsilon_greedy_decays_and_explores():
    method = FedFomo(epsilon=0.3, epsilon_decay=0.05)
    assert [round(method.exploration(t), 10) for t in (1, 3, 7, 9)] == [0.3, 0.2, 0.0, 0.0]
    server = MethodServer(FedFomo(models=2, epsilon=1.0, epsilon_decay=0.0), clients_per_round=5, seed=0)
    server.initialize(_arrays(0.0))
    server.plan_training(1, [1, 2, 3, 4, 5])
    server.aggregate(1, [server.check(_reply(c, float(c), [0.0, 0.0])) for c in (1, 2, 3, 4, 5)])
    server.method.affinity[1] = {2: 9.0, 3: 8.0}  # ignored when exploring
    picks = set()
    for rnd in range(2, 12):
        server.plan_training(rnd, [1, 2, 3, 4, 5])
        picks.add(tuple(server.method._downloads[1]))
    assert len(picks) > 3 and all(1 not in p for p in picks)


@pytest.mark.parametrize("extras, reason", [({}, "lacks"), ({WEIGHTS: b"\x00" * 4}, "expected 2"),
                                            ({WEIGHTS: encode_vector(torch.tensor([float("nan"), 0.0]))}, "NaN")])
def test_bad_weights_are_refused(extras, reason):
    server = MethodServer(FedFomo(models=2), clients_per_round=2)
    server.initialize(_arrays(0.0))
    server.plan_training(1, [1, 2])
    arrays = _arrays(1.0)
    with pytest.raises(UpdateRejected, match=reason):
        server.check(RawReply(1, list(arrays.values()), list(arrays), 10, {}, extras))


def test_huge_weights_are_refused_against_the_round_median():
    server = MethodServer(FedFomo(models=2, epsilon=0.0), clients_per_round=3)
    server.initialize(_arrays(0.0))
    server.plan_training(1, [1, 2, 3])
    batch = server.receive([_reply(1, 0.1, [0.1, 0.2]), _reply(2, 0.1, [0.2, 0.1]), _reply(3, 0.1, [1e9, 0.0])])
    assert [r.client_id for r in batch.accepted] == [1, 2] and WEIGHTS in batch.rejections[0][1]


@pytest.mark.parametrize("kwargs, name", [({"models": 0}, "models"), ({"epsilon": 1.5}, "epsilon"),
                                          ({"epsilon_decay": -0.1}, "epsilon_decay"), ({"val_fraction": 1.0}, "val_fraction")])
def test_bad_hyperparameters_are_refused(kwargs, name):
    with pytest.raises(ValueError, match=f"{name} = "):
        FedFomo(**kwargs)


# --- 4. a whole run --------------------------------------------------------------------------------

def test_short_run_as_recorded_and_far_better_than_fedavg(short_runs):
    fedfomo = short_runs("fedfomo")
    assert fedfomo["bmta"] > short_runs("fedavg")["bmta"] + 0.3  # observed 0.776 against 0.306
    assert_as_recorded("fedfomo", fedfomo)
