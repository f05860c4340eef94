"""The client-speed benchmark's command at a tiny size: the four ways run on the same clients and the
table says how they compare (the figures themselves are the benchmark's, not the test's); the bare
batched loop trains a model with batch normalization as the bare sequential loop does."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from benchmarks import client_speed
from benchmarks.client_floor import Federation, batched_evaluate, batched_round, evaluate, sequential_round


def test_the_four_ways_are_timed_and_tabled(tmp_path):
    result = client_speed.main(["--models", "mlr", "--devices", "cpu", "--rounds", "3", "--repeats", "2", "--out", str(tmp_path)])
    (row,) = result["rows"]
    ways = ("bare_sequential", "bare_batched", "package_sequential", "package_batched")
    assert all(row[w] > 0 and row[f"{w}_evaluation"] > 0 and len(row["all"][w]) == 2 for w in ways)
    table = (tmp_path / "table.md").read_text()
    assert f"| {row['bare_batched_evaluation']:.4f} | {row['package_batched_evaluation']:.4f} (" in table
    assert f"| mlr | cpu | {row['bare_sequential']:.4f} | {row['bare_batched']:.4f} |" in table
    assert json.loads((tmp_path / "results.json").read_text())["rows"][0]["package_batched"] == row["package_batched"]


def test_the_cifar100_cnn_on_written_files(tmp_path):
    result = client_speed.main(["--models", "cnn-cifar100", "--devices", "cpu", "--rounds", "3", "--repeats", "1",
                                "--clients", "4", "--per-round", "2", "--local-steps", "1", "--images", "120",
                                "--out", str(tmp_path)])
    (row,) = result["rows"]
    assert (row["clients"], row["per_round"]) == (4, 2) and result["local_steps"] == 1
    assert f"| cnn-cifar100 | cpu | {row['bare_sequential']:.4f} | {row['bare_batched']:.4f} |" in (tmp_path / "table.md").read_text()


def test_the_bare_batched_round_keeps_each_clients_batch_norm_buffers():
    def model():
        torch.manual_seed(1)
        return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))

    g = torch.Generator().manual_seed(0)
    sizes = (12, 12, 5)  # the last client has fewer examples than a batch: a group of its own
    xs, ys = [torch.randn(n, 3, 8, 8, generator=g) for n in sizes], [torch.randint(0, 5, (n,), generator=g) for n in sizes]
    fed = Federation(xs, ys, xs, ys, model)
    one_by_one, together = model(), model()
    for train, m in ((sequential_round, one_by_one), (batched_round, together)):
        train(fed, m, [0, 1, 2], steps=3, batch=6, lr=0.1, generator=torch.Generator().manual_seed(0))
    for (name, a), b in zip(one_by_one.state_dict().items(), together.state_dict().values()):
        assert torch.allclose(a.float(), b.float(), atol=1e-6), name
    assert int(together.state_dict()["1.num_batches_tracked"]) == 3
    assert not torch.equal(together.state_dict()["1.running_mean"], torch.zeros(4))
    assert evaluate(one_by_one, fed) == pytest.approx(evaluate(together, fed))


def test_the_bare_batched_evaluation_gives_the_one_by_one_figures():
    g = torch.Generator().manual_seed(0)
    sizes = (7, 3, 12)
    xs, ys = [torch.randn(n, 5, generator=g) for n in sizes], [torch.randint(0, 4, (n,), generator=g) for n in sizes]
    torch.manual_seed(2)
    model = nn.Linear(5, 4)
    fed = Federation(xs, ys, xs, ys, lambda: model)
    loss, accuracy = batched_evaluate(model, fed)
    assert (loss, accuracy) == pytest.approx(evaluate(model, fed))
    hits = [float((model(x).argmax(1) == y).float().mean()) for x, y in zip(xs, ys)]
    assert accuracy == pytest.approx(sum(hits) / 3)  # a mean over clients, not over samples
    assert model.training
