"""A researcher's own data and model by import path (``dataset = "pkg.module:function"``, ``model =
"pkg.module:factory"``): partitioned, split and run like the package's own, either with the package's
entries for the other, and every mistake refused with the import path and what is wrong."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from flower_pfl.experiment.build import data_info, load_client_data, make_model
from flower_pfl.experiment.config import ConfigError, ExperimentConfig
from server_apps.inprocess import run_in_process

QUICK = {"num-rounds": 2, "clients-per-round": 2, "local-steps": 3, "batch-size": 8, "eval-every": 1, "figures": False}


def test_own_features_are_partitioned_by_their_client_ids_or_by_label():
    natural = ExperimentConfig(dataset="tests.own_cases:features", partition="natural", model="dnn")
    assert data_info(natural).input_shape == (2, 5) and data_info(natural).num_classes == 3 and data_info(natural).kind == "signals"
    clients = [load_client_data(natural, pid, 4) for pid in range(4)]
    assert [c.group for c in clients] == ["sensor0", "sensor1", "sensor2", "sensor3"]
    assert [c.num_train + len(c.y_test) for c in clients] == [30] * 4 and clients[0].x_train.dtype == torch.float32
    x, y, sensors = __import__("tests.own_cases", fromlist=["features"]).features()
    first = x.astype(np.float32)[[i for i, s in enumerate(sensors) if s == "sensor0"]]
    assert all(any(np.array_equal(row, f) for f in first) for row in clients[0].x_test.numpy())  # the samples as given
    iid = ExperimentConfig(dataset="tests.own_cases:features", partition="dirichlet", dirichlet_alpha=0.3, model="dnn")
    assert sum(load_client_data(iid, pid, 3).num_train + len(load_client_data(iid, pid, 3).y_test) for pid in range(3)) == 120


def test_own_token_ids_take_the_vocabulary_from_the_data_unless_a_key_sets_it():
    cfg = ExperimentConfig(dataset="tests.own_cases:token_ids", partition="iid", model="lstm")
    info = data_info(cfg)
    assert info.kind == "tokens" and info.vocab_size == 17 and info.input_shape == (6,)
    assert make_model(cfg).embedding.num_embeddings == 17 and load_client_data(cfg, 0, 2).x_train.dtype == torch.int64
    assert make_model(ExperimentConfig(dataset="tests.own_cases:token_ids", partition="iid", model="lstm",
                                       vocab_size=40)).embedding.num_embeddings == 40
    with pytest.raises(ConfigError, match="'vocab-size' = 10 is invalid: the data's token ids reach 16"):
        data_info(ExperimentConfig(dataset="tests.own_cases:token_ids", partition="iid", model="lstm", vocab_size=10))


@pytest.mark.parametrize("path,message", [
    ("tests.no_such_module:load", "module 'tests.no_such_module' is not importable"),
    ("tests.own_cases:missing", "'tests.own_cases' has no 'missing'"),
    ("tests.own_cases:NOT_CALLABLE", "'NOT_CALLABLE' is not a function \\(it is of type int\\)"),
    ("tests.own_cases:not_a_pair", "returned a ndarray; it must return \\(x, y\\) or \\(x, y, client_ids\\)"),
    ("tests.own_cases:float_labels", "labels are float64, not integers"),
    ("tests.own_cases:byte_images", "x is uint8; give floating-point features"),
    ("tests.own_cases:with_nan", "x holds NaN or infinite values"),
    ("tests.own_cases:ragged_labels", "y must be one label per sample \\(4\\)"),
])
def test_own_data_mistakes_name_the_import_path_and_what_is_wrong(path, message):
    with pytest.raises(ConfigError, match=f"run config 'dataset' = '{path}': .*{message}"):
        load_client_data(ExperimentConfig(dataset=path, partition="iid"), 0, 2)


@pytest.mark.parametrize("path,message", [
    ("tests.own_cases:not_a_module", "returned a str, not a torch.nn.Module"),
    ("tests.own_cases:wrong_logits", "maps 2 samples of shape \\(60,\\) to \\(2, 11\\); it must give logits of shape \\(2, 10\\)"),
    ("tests.own_cases:broken", "fails on a batch of 2 samples of shape \\(60,\\)"),
    ("tests.nowhere:net", "module 'tests.nowhere' is not importable"),
])
def test_own_model_mistakes_name_the_import_path_and_what_is_wrong(path, message):
    with pytest.raises(ConfigError, match=f"run config 'model' = '{path}': .*{message}"):
        make_model(ExperimentConfig(model=path))


def test_a_config_names_no_dataset_or_model_that_is_neither_a_name_nor_an_import_path():
    with pytest.raises(ConfigError, match="'dataset' = 'cifar-10' is invalid: must be one of .*cifar10.*or an import path"):
        ExperimentConfig(dataset="cifar-10")
    with pytest.raises(ConfigError, match="'model' = 'resnet' is invalid: must be one of .*resnet18.*or an import path"):
        ExperimentConfig(model="resnet")


def test_own_data_with_a_package_model_and_own_model_with_package_data_run_in_process(tmp_path):
    own_data = run_in_process({**QUICK, "dataset": "tests.own_cases:features", "partition": "natural", "model": "dnn",
                               "method": "fedper", "output-dir": str(tmp_path / "a")}, num_clients=4)
    summary = json.loads((own_data / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["client_groups"] == {str(i): f"sensor{i}" for i in range(4)}
    assert own_data.name.startswith("fedper-features-dnn-seed0")
    own_model = run_in_process({**QUICK, "model": "tests.own_cases:net", "method": "fedrep", "output-dir": str(tmp_path / "b")},
                               num_clients=4)
    assert json.loads((own_model / "summary.json").read_text())["status"] == "completed" and own_model.name.startswith("fedrep-synthetic-net")
    with pytest.raises(ConfigError, match="'fedbn' cannot run on model 'tests.own_cases:net': it needs a model with batch normalization"):
        run_in_process({**QUICK, "model": "tests.own_cases:net", "method": "fedbn", "output-dir": str(tmp_path / "c")}, num_clients=4)
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").iterdir())
