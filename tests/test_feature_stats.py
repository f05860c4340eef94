"""Feature statistics sent up (flower_pfl/engine/feature_stats.py): the class statistics of a model's
representation by hand, their bytes, what is refused on arrival, and their pooling over clients."""

from __future__ import annotations

import pytest
import torch

from flower_pfl.engine.feature_stats import (
    FeatureStats,
    class_statistics,
    pooled_class_means,
    received_statistics,
    representation_size,
)
from flower_pfl.engine.layout import ParamLayout
from flower_pfl.engine.reply_checks import AlgorithmOutputMissing
from flower_pfl.engine.wire import encode_vector
from flower_pfl.experiment.models import DNN, MLR


def _model() -> DNN:
    torch.manual_seed(0)
    return DNN(3, 3, hidden=2)


def test_class_statistics_by_hand():
    model = _model()
    x = torch.randn(7, 3, generator=torch.Generator().manual_seed(1))
    y = torch.tensor([0, 0, 0, 2, 2, 0, 2])  # class 1 absent
    model.train()
    stats = class_statistics(model, x, y, batch_size=3)  # in chunks
    assert model.training  # the mode is restored
    with torch.no_grad():
        z = torch.relu(model.fc1(x))
    for c, share in ((0, 4 / 7), (2, 3 / 7)):
        zc = z[y == c]
        assert float(stats.shares[c]) == pytest.approx(share)
        torch.testing.assert_close(stats.means[c], zc.mean(0))
        assert float(stats.variances[c]) == pytest.approx(float(((zc - zc.mean(0)) ** 2).sum(1).mean()), rel=1e-5)
        assert float(stats.second_moments()[c]) == pytest.approx(float((zc ** 2).sum(1).mean()), rel=1e-5)
    assert float(stats.shares[1]) == 0 and torch.all(stats.means[1] == 0) and float(stats.variances[1]) == 0
    torch.testing.assert_close(stats.mean(), z.mean(0))
    with pytest.raises(ValueError, match="no data"):
        class_statistics(model, x[:0], y[:0])


def test_bytes_round_trip_and_checks_on_arrival():
    stats = FeatureStats.example(3, 2, torch.Generator().manual_seed(0))
    back = received_statistics({"k": stats.encode()}, "k", 3, 2, "SomeClient")
    assert all(torch.equal(a, b) for a, b in zip((back.shares, back.means, back.variances), (stats.shares, stats.means, stats.variances)))
    with pytest.raises(AlgorithmOutputMissing, match="lacks 'k'"):
        received_statistics({}, "k", 3, 2, "SomeClient")
    bad = {"size": (encode_vector(torch.zeros(5)), "expected 12"),
           "nan": (FeatureStats(stats.shares, stats.means.fill_diagonal_(float("nan")), stats.variances).encode(), "NaN"),
           "sum": (FeatureStats(torch.tensor([0.5, 0.2, 0.0]), torch.zeros(3, 2), torch.zeros(3)).encode(), "sum to 1"),
           "negative share": (FeatureStats(torch.tensor([2.0, -1.0, 0.0]), torch.zeros(3, 2), torch.zeros(3)).encode(), "shares"),
           "negative variance": (FeatureStats(torch.tensor([1.0, 0.0, 0.0]), torch.zeros(3, 2), torch.tensor([0.0, -1.0, 0.0])).encode(),
                                 "variances")}
    for data, reason in bad.values():
        with pytest.raises(ValueError, match=reason):
            received_statistics({"k": data}, "k", 3, 2, "SomeClient")


def test_pooling_weights_each_clients_class_by_its_samples_of_it():
    a = FeatureStats(torch.tensor([0.5, 0.5, 0.0]), torch.tensor([[1.0, 0.0], [2.0, 2.0], [0.0, 0.0]]), torch.zeros(3))
    b = FeatureStats(torch.tensor([1.0, 0.0, 0.0]), torch.tensor([[4.0, 4.0], [0.0, 0.0], [0.0, 0.0]]), torch.zeros(3))
    means, known = pooled_class_means([a, b], [10, 30])  # class 0: 5 and 30 samples
    assert known.tolist() == [True, True, False]
    torch.testing.assert_close(means, torch.tensor([[(5 * 1 + 30 * 4) / 35, 30 * 4 / 35], [2.0, 2.0], [0.0, 0.0]]))


def test_representation_size_from_the_last_weight_matrix():
    assert representation_size(ParamLayout.from_module(_model()), "X") == (3, 2)
    assert representation_size(ParamLayout.from_module(MLR(4, 5)), "X") == (5, 4)
    with pytest.raises(ValueError, match="X needs a last linear layer"):
        representation_size(ParamLayout.from_module(torch.nn.BatchNorm1d(3)), "X")
