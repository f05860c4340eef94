import torch

from flower_pfl.engine.client_algorithm import PROXIMAL_MU, ClientAlgorithm, Proximal, TrainData, train_locally
from flower_pfl.engine.evaluation import evaluate
from flower_pfl.engine.minibatches import MinibatchStream
from flower_pfl.experiment.models import MLR


def local_sgd(model, x, y, *, steps, lr, batch_size, prox_mu, generator):
    """The package's loop with the proximal step (plain local SGD for ``prox_mu = 0``)."""
    step = Proximal(model, {PROXIMAL_MU: prox_mu}) if prox_mu > 0 else ClientAlgorithm(model, {})
    return train_locally(step, model, TrainData(x, y), steps=steps, lr=lr, batch_size=batch_size, generator=generator)[0]


def _data(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 5, generator=g)
    y = (x[:, 0] > 0).long()
    return x, y


def test_minibatches_are_fresh_until_the_data_is_used_up():
    stream = MinibatchStream(10, 3, torch.Generator().manual_seed(0))
    first = torch.cat([stream.next() for _ in range(3)])
    assert len(set(first.tolist())) == 9  # no index repeats within an epoch
    assert len(stream.next()) == 3  # reshuffled, still full batches
    assert len(MinibatchStream(2, 5, torch.Generator()).next()) == 2


def test_lambda_zero_is_plain_sgd():
    x, y = _data()
    torch.manual_seed(0)
    model = MLR(5, 2)
    start = torch.cat([p.detach().flatten() for p in model.parameters()])
    local_sgd(model, x, y, steps=30, lr=0.5, batch_size=8, prox_mu=0.0, generator=torch.Generator().manual_seed(1))
    end = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert (end - start).norm() > 0.1
    # plain SGD, by hand: same batches, same steps, no proximal term
    torch.manual_seed(0)
    ref = MLR(5, 2)
    stream = MinibatchStream(64, 8, torch.Generator().manual_seed(1))
    for _ in range(30):
        idx = stream.next()
        loss = torch.nn.functional.cross_entropy(ref(x[idx]), y[idx])
        grads = torch.autograd.grad(loss, list(ref.parameters()))
        with torch.no_grad():
            for p, g in zip(ref.parameters(), grads):
                p -= 0.5 * g
    assert torch.allclose(torch.cat([p.flatten() for p in ref.parameters()]), end, atol=1e-6)


def test_anchor_is_fixed_for_the_round():
    x = torch.zeros(8, 3)
    y = torch.zeros(8, dtype=torch.long)
    model = torch.nn.Linear(3, 2, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    # zero inputs: the data loss has zero gradient w.r.t. the weight, only the proximal term acts,
    # but it pulls toward the *initial* weight (itself), so the weight must not move at all.
    local_sgd(model, x, y, steps=5, lr=0.1, batch_size=4, prox_mu=3.0, generator=torch.Generator())
    assert torch.equal(model.weight, torch.ones(2, 3))


def test_proximal_pull_reduces_drift():
    x, y = _data()
    drift = {}
    for mu in (0.0, 5.0):
        torch.manual_seed(0)
        model = MLR(5, 2)
        start = torch.cat([p.detach().flatten() for p in model.parameters()])
        local_sgd(model, x, y, steps=40, lr=0.1, batch_size=8, prox_mu=mu, generator=torch.Generator().manual_seed(2))
        drift[mu] = float((torch.cat([p.detach().flatten() for p in model.parameters()]) - start).norm())
    assert drift[5.0] < 0.7 * drift[0.0]


def test_evaluate_counts_correct_predictions():
    model = torch.nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.eye(2))
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 1.0], [0.0, 3.0]])
    y = torch.tensor([0, 1, 1, 1])
    res = evaluate(model, x, y, batch_size=3)
    assert res.accuracy == 0.75 and res.num_examples == 4 and res.loss > 0


def test_training_settings_name_what_is_missing():
    import pytest

    from flower_pfl.experiment.build import training_settings

    with pytest.raises(ValueError, match="local-steps"):
        training_settings({"lr": 0.1, "batch-size": 4}, seed=0, partition_id=0)
    settings = training_settings({"lr": 0.1, "batch-size": 4, "local-steps": 2, "server-round": 3}, seed=0, partition_id=0)
    assert settings["steps"] == 2 and settings["lr"] == 0.1 and settings["batch_size"] == 4


def test_legacy_fedprox_key_is_understood():
    from flower_pfl.methods.registry import client_algorithm_for

    assert client_algorithm_for({"proximal_mu": 0.5}) is Proximal and client_algorithm_for({"proximal-mu": 0.0}) is ClientAlgorithm


def test_a_vector_over_the_whole_flat_model_maps_onto_the_trainable_parameters_and_back():
    """The server's vectors (SCAFFOLD's c, IGFL's Δw_ps) span the whole flat model, batch norm's statistics
    included; a client's per-parameter tensors (its Δc_i, Elastic's sensitivity) go back the same way."""
    from flower_pfl.engine.client_algorithm import over_state, trainable, trainable_part
    from flower_pfl.engine.layout import ParamLayout
    from flower_pfl.engine.wire import encode_vector
    from flower_pfl.experiment.models import DNN

    model = DNN(5, 3, 4, batch_norm=True)
    layout = ParamLayout.from_module(model)
    whole = torch.arange(layout.dim, dtype=torch.float32)
    parts = trainable_part(model, encode_vector(whole))
    assert [tuple(p.shape) for p in parts] == [tuple(p.shape) for p in trainable(model)]
    slices = dict(zip(layout.names, layout.tensor_slices()))
    assert torch.equal(parts[2], whole[slices["bn1.weight"]]) and torch.equal(parts[-1], whole[slices["fc2.bias"]])
    back = over_state(model, parts)
    statistics = [slices[n] for n in layout.names if n.startswith("bn1.") and n not in ("bn1.weight", "bn1.bias")]
    assert all(torch.all(back[s] == 0) for s in statistics)  # running mean, variance, counter: none of theirs
    back[torch.cat([torch.arange(s.start, s.stop) for s in statistics])] = whole[torch.cat([torch.arange(s.start, s.stop) for s in statistics])]
    assert torch.equal(back, whole)
