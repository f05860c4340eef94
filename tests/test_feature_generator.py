"""The generator trained on the server (``flower_pfl/engine/feature_generator.py``): its losses by hand,
its training against an ensemble of heads, its state (an exact resume) and its transport."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from flower_pfl.engine.feature_generator import (
    FeatureGenerator,
    GeneratorTrainer,
    decode_generator,
    diversity_loss,
    encode_generator,
    ensemble_loss,
    label_weights,
    linear_heads,
)
from flower_pfl.engine.wire import encode_vector

C, D = 3, 2


def _generator(seed: int = 0) -> FeatureGenerator:
    torch.manual_seed(seed)
    return FeatureGenerator(noise_dim=4, classes=C, hidden=8, features=D)


def test_diversity_loss_by_hand():
    noise, features = torch.tensor([[0.0, 0.0], [1.0, 3.0]]), torch.tensor([[1.0, 2.0, 3.0], [2.0, 2.0, 1.0]])
    noise_distance, feature_distance = (1 + 9) / 2, (1 + 0 + 2) / 3  # mean squared, mean absolute
    # the mean over the 2 x 2 pairs, whose diagonal is 0
    assert float(diversity_loss(noise, features)) == pytest.approx(math.exp(-2 * noise_distance * feature_distance / 4))


def test_label_weights_are_each_clients_share_of_a_class():
    counts = torch.tensor([[3.0, 0.0, 0.0], [1.0, 2.0, 0.0]])  # two clients, class 2 held by nobody
    assert label_weights(counts).tolist() == [[0.75, 0.25], [0.0, 1.0], [0.0, 0.0]]


def test_ensemble_loss_by_hand():
    logits = torch.tensor([[[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]], [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]])  # (K=2, n=2, C)
    labels, weights = torch.tensor([0, 1]), torch.tensor([[0.75, 0.25], [0.0, 1.0], [0.5, 0.5]])
    ce = lambda row, y: -(row[y] - math.log(sum(math.exp(v) for v in row)))
    client0 = (0.75 * ce([2.0, 0.0, 0.0], 0) + 0.0 * ce([0.0, 1.0, 0.0], 1)) / 2
    client1 = (0.25 * ce([0.0, 0.0, 0.0], 0) + 1.0 * ce([1.0, 1.0, 1.0], 1)) / 2
    assert float(ensemble_loss(logits, labels, weights)) == pytest.approx(client0 + client1)


def test_linear_heads_are_each_clients_linear_layer():
    weights, biases, z = torch.randn(2, C, D), torch.randn(2, C), torch.randn(5, D)
    logits = linear_heads(weights, biases)(z)
    for k in range(2):
        assert torch.allclose(logits[k], F.linear(z, weights[k], biases[k]), atol=1e-6)


def _heads() -> tuple[torch.Tensor, torch.Tensor]:
    """Client 0 knows classes 0 and 1 (by the first feature), client 1 class 1 and 2 (by the second)."""
    weights = torch.tensor([[[4.0, 0.0], [-4.0, 0.0], [0.0, 0.0]], [[0.0, 0.0], [0.0, 4.0], [0.0, -4.0]]])
    return weights, torch.zeros(2, C)


def test_training_learns_features_the_heads_holding_a_class_classify_as_it():
    counts = torch.tensor([[10.0, 5.0, 0.0], [0.0, 5.0, 10.0]])
    trainer = GeneratorTrainer(_generator(), lr=0.01)
    ensemble, rng = linear_heads(*_heads()), torch.Generator().manual_seed(0)
    weights = label_weights(counts)

    def teacher() -> float:
        trainer.generator.eval()
        labels = torch.tensor([0, 1, 2] * 20)
        with torch.no_grad():
            return float(ensemble_loss(ensemble(trainer.generator.sample(labels, torch.Generator().manual_seed(9))[0]), labels, weights))

    before = teacher()
    losses = trainer.train(ensemble, counts, steps=300, batch_size=16, diversity=0.0, rng=rng)
    assert teacher() < 0.2 * before and losses["teacher-loss"] < before
    assert trainer.labels.tolist() == [1.0, 1.0, 1.0] and trainer.lr == 0.01
    features = trainer.generator(torch.tensor([0, 2]), torch.full((2, 4), 0.5)).detach()
    assert features[0, 0] > 0 and features[1, 1] < 0  # class 0 where client 0 says 0, class 2 where client 1 says 2


def test_labels_are_drawn_from_the_classes_held_and_the_rate_decays():
    counts = torch.tensor([[4.0, 0.0, 0.0], [3.0, 0.0, 1.0]])
    trainer = GeneratorTrainer(_generator(), lr=0.01, weight_decay=0.01, lr_decay=0.5)
    trainer.train(linear_heads(*_heads()), counts, steps=2, batch_size=4, diversity=1.0, rng=torch.Generator().manual_seed(1))
    assert trainer.labels.tolist() == [1.0, 0.0, 1.0] and trainer.lr == 0.005
    with pytest.raises(ValueError, match="at least one example"):
        trainer.train(linear_heads(*_heads()), torch.zeros(2, C), steps=1, batch_size=4, diversity=1.0, rng=torch.Generator())


def test_the_diversity_term_changes_the_steps():
    counts = torch.tensor([[4.0, 4.0, 0.0], [0.0, 3.0, 3.0]])
    plain, spread = GeneratorTrainer(_generator(), lr=0.01), GeneratorTrainer(_generator(), lr=0.01)
    plain.train(linear_heads(*_heads()), counts, steps=3, batch_size=8, diversity=0.0, rng=torch.Generator().manual_seed(2))
    spread.train(linear_heads(*_heads()), counts, steps=3, batch_size=8, diversity=5.0, rng=torch.Generator().manual_seed(2))
    assert not torch.allclose(plain.generator.out.weight, spread.generator.out.weight)


def test_state_resumes_exactly():
    counts, ensemble = torch.tensor([[4.0, 4.0, 0.0], [0.0, 3.0, 3.0]]), linear_heads(*_heads())
    a = GeneratorTrainer(_generator(0), lr=0.01, weight_decay=0.01, lr_decay=0.9)
    a.train(ensemble, counts, steps=3, batch_size=8, diversity=1.0, rng=torch.Generator().manual_seed(3))
    b = GeneratorTrainer(_generator(5), lr=0.01, weight_decay=0.01, lr_decay=0.9)
    b.set_state(a.get_state())
    for t in (a, b):
        t.train(ensemble, counts, steps=3, batch_size=8, diversity=1.0, rng=torch.Generator().manual_seed(4))
    for x, y in zip(a.generator.state_dict().values(), b.generator.state_dict().values()):
        assert torch.equal(x, y)
    assert a.lr == b.lr == pytest.approx(0.01 * 0.9 ** 2) and torch.equal(a.labels, b.labels)
    assert a.optimizer.state[a.generator.out.weight]["step"] == 6


def test_transport_round_trips_and_refuses_bad_bytes():
    sent = _generator(0)
    sent.train()
    sent(torch.tensor([0, 1, 2, 1]), torch.rand(4, 4))  # running statistics that must travel too
    labels = torch.tensor([True, False, True])
    data = encode_generator(sent, labels)
    received = _generator(7)
    assert decode_generator(data, received).tolist() == [True, False, True] and not received.training
    sent.eval()
    noise = torch.rand(3, 4)
    assert torch.equal(received(torch.tensor([0, 1, 2]), noise), sent(torch.tensor([0, 1, 2]), noise))
    with pytest.raises(ValueError, match="'g': expected"):
        decode_generator(data[:-4], received, "g")
    with pytest.raises(ValueError, match="NaN"):
        decode_generator(encode_vector(torch.full((len(data) // 4,), float("nan"))), received)
