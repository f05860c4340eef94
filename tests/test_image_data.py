"""Image data sets through torchvision from a local folder, on files the tests write."""

import json
import os

import image_files as files
import numpy as np
import pytest

from flower_pfl.experiment.config import ConfigError, ExperimentConfig
from flower_pfl.experiment.data.images import to_float
from flower_pfl.experiment.datasets import registry
from server_apps.inprocess import run_in_process


def load_image_pool(name, root, **options):
    """Data set ``name``'s samples from its files under ``root``, as the experiment reads them."""
    pool = registry.instance(name, options).load_files(root, download=False)
    return pool.x, pool.y


def test_fashion_mnist_idx_files(tmp_path):
    written = files.write_fashion_mnist(tmp_path, 30, 10)
    x, y = load_image_pool("fmnist", tmp_path)
    assert x.shape == (40, 1, 28, 28) and x.dtype == np.uint8 and y.dtype == np.int64
    assert np.array_equal(x[:30, 0], written["train"][0]) and np.array_equal(y[30:], written["t10k"][1])


def test_emnist_is_returned_upright(tmp_path):
    written = files.write_emnist(tmp_path, "byclass", 20, 5, classes=62)
    x, y = load_image_pool("emnist", tmp_path, **{"emnist-split": "byclass"})
    assert x.shape == (25, 1, 28, 28)
    assert np.array_equal(x[:20, 0], written["train"][0]) and (x[:, 0, 0, :5] == 255).all()
    assert np.array_equal(y[20:], written["test"][1])


def test_cifar10_pickled_batches(tmp_path, monkeypatch):
    import torchvision.datasets.cifar as cifar

    # our files cannot match the real archive's md5 sums; everything else is torchvision's own code
    monkeypatch.setattr(cifar, "check_integrity", lambda path, md5=None: os.path.isfile(path))
    written = files.write_cifar10(tmp_path, per_batch=4)
    x, y = load_image_pool("cifar10", tmp_path)
    assert x.shape == (24, 3, 32, 32)
    assert np.array_equal(x[:4], written["data_batch_1"][0]) and np.array_equal(y[-4:], written["test_batch"][1])


def test_missing_files_say_where_they_were_looked_for(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        load_image_pool("fmnist", tmp_path)


def test_pixels_scaled_to_plus_minus_one():
    assert np.allclose(to_float(np.array([0, 255], np.uint8)), [-1.0, 1.0])


def test_image_data_needs_a_label_partition():
    with pytest.raises(ConfigError, match="'partition'.*dirichlet"):
        ExperimentConfig.from_mapping({"dataset": "fmnist"})


def test_fmnist_cnn_run_end_to_end(tmp_path):
    files.write_fashion_mnist(tmp_path / "data", 400, 100)
    out = run_in_process({"dataset": "fmnist", "data-dir": str(tmp_path / "data"), "partition": "pathological",
                          "model": "cnn", "method": "fedacs", "num-rounds": 2, "clients-per-round": 3,
                          "local-steps": 2, "eval-every": 1, "output-dir": str(tmp_path / "out")}, num_clients=5)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["evaluated_rounds"] == 2 and 0 <= summary["bmta"] <= 1
