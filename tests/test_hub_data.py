"""Data sets read from the Hugging Face hub's files (``data-source = "huggingface"``) through ``datasets``, on
local folders in the hub's layout; ``"flwr-datasets"``, the value's old name, still reads them."""

import json
import warnings

import image_files as files
import numpy as np
import pytest

from flower_pfl.experiment.build import load_client_data
from flower_pfl.experiment.config import ConfigError, ExperimentConfig, current_values
from server_apps.inprocess import run_in_process


def test_fmnist_dirichlet_partitions_cover_the_train_split(tmp_path):
    labels = np.random.default_rng(0).integers(0, 10, 300)
    files.write_hub_folder(tmp_path, "image", "label", labels, (28, 28))
    cfg = ExperimentConfig(dataset="fmnist", data_source="huggingface", hub_dataset=str(tmp_path),
                           partition="dirichlet", dirichlet_alpha=1.0)
    clients = [load_client_data(cfg, pid, 5) for pid in range(5)]
    assert sum(c.num_train + len(c.y_test) for c in clients) == 300
    assert all(tuple(c.x_train.shape[1:]) == (1, 28, 28) and c.x_train.min() >= -1 and c.x_train.max() <= 1 for c in clients)
    again = load_client_data(cfg, 3, 5)
    assert np.array_equal(again.y_test.numpy(), clients[3].y_test.numpy())


def test_paired_clients_split_one_hub_partition(tmp_path):
    labels = np.random.default_rng(1).integers(0, 10, 400)
    files.write_hub_folder(tmp_path, "image", "label", labels, (28, 28))
    common = {"dataset": "fmnist", "data_source": "huggingface", "hub_dataset": str(tmp_path), "partition": "shards"}
    twins = [load_client_data(ExperimentConfig(**common, paired_clients=True), pid, 4) for pid in range(4)]
    groups = [load_client_data(ExperimentConfig(**common), pid, 2) for pid in range(2)]
    for k, group in enumerate(groups):
        pair = twins[2 * k: 2 * k + 2]
        assert sum(c.num_train + len(c.y_test) for c in pair) == group.num_train + len(group.y_test)
        labels_of = [set(c.y_train.tolist()) | set(c.y_test.tolist()) for c in pair]
        assert labels_of[0] == labels_of[1] == set(group.y_train.tolist()) | set(group.y_test.tolist())


def test_femnist_natural_partition_is_one_writer_per_client(tmp_path):
    labels = np.random.default_rng(1).integers(0, 62, 120)
    writers = [f"writer{i % 6}" for i in range(120)]
    files.write_hub_folder(tmp_path, "image", "character", labels, (28, 28), writers=writers)
    cfg = ExperimentConfig(dataset="femnist", data_source="huggingface", hub_dataset=str(tmp_path),
                           partition="natural", train_samples_per_client=8)
    sizes = []
    for pid in range(6):
        c = load_client_data(cfg, pid, 6)
        assert c.num_train == 8  # data scarcity applies to natural partitions too
        sizes.append(len(c.y_test))
    assert sum(sizes) == 6 * 5  # 20 samples per writer, 25% of them for testing
    with pytest.raises(ConfigError, match="has 6 natural clients, fewer than the 7 clients asked for by one client per node"):
        load_client_data(cfg, 6, 7)


def test_sources_are_checked_at_start_and_the_hubs_files_are_found_under_data_dir(tmp_path):
    with pytest.raises(ConfigError, match="'dataset' = 'emnist' is invalid: must be one of .*femnist.* with data-source 'huggingface'"):
        ExperimentConfig.from_mapping({"dataset": "emnist", "data-source": "huggingface", "partition": "iid"})
    # FEMNIST has no files of its own: with either source its hub files are read from <data-dir>/<hub id>
    labels = np.random.default_rng(1).integers(0, 62, 40)
    files.write_hub_folder(tmp_path / "flwrlabs" / "femnist", "image", "character", labels, (28, 28), writers=[f"w{i % 4}" for i in range(40)])
    cfg = ExperimentConfig(dataset="femnist", partition="natural", data_dir=str(tmp_path))
    # 10 samples a writer: 8 for training at train-fraction 0.75, but min-test-samples (5) keeps 5 for testing
    assert sum(len(load_client_data(cfg, pid, 4).y_test) for pid in range(4)) == 4 * 5
    with pytest.raises(ConfigError, match="could not be read from the local folder"):
        load_client_data(ExperimentConfig(dataset="femnist", partition="natural", data_source="huggingface",
                                          hub_dataset=str(tmp_path / "nowhere")), 0, 2)


def test_the_old_source_name_still_reads_the_hubs_files_with_a_warning(tmp_path):
    labels = np.random.default_rng(3).integers(0, 62, 60)
    files.write_hub_folder(tmp_path, "image", "character", labels, (28, 28), writers=[f"w{i % 3}" for i in range(60)])
    settings = {"dataset": "femnist", "partition": "natural", "hub-dataset": str(tmp_path)}
    with pytest.warns(FutureWarning, match="'data-source' = 'flwr-datasets' is now 'huggingface'"):
        old = ExperimentConfig.from_mapping({**settings, "data-source": "flwr-datasets"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = ExperimentConfig.from_mapping({**settings, "data-source": "huggingface"})
    assert old == new and old.to_run_config()["data-source"] == "huggingface"
    # the writers (the data set's group column) are the clients either way
    assert [load_client_data(old, pid, 3).y_train.tolist() for pid in range(3)] == \
        [load_client_data(new, pid, 3).y_train.tolist() for pid in range(3)]
    # a checkpoint's config written before the rename reads as today's (a resumed run is not refused)
    assert current_values({"data-source": "flwr-datasets", "seed": 1}) == {"data-source": "huggingface", "seed": 1}


def test_femnist_run_end_to_end(tmp_path):
    labels = np.random.default_rng(2).integers(0, 62, 160)
    files.write_hub_folder(tmp_path / "femnist", "image", "character", labels, (28, 28),
                           writers=[f"w{i % 4}" for i in range(160)])
    out = run_in_process({"dataset": "femnist", "data-source": "huggingface", "hub-dataset": str(tmp_path / "femnist"),
                          "partition": "natural", "model": "cnn", "method": "fedmcsa", "num-rounds": 2,
                          "clients-per-round": 2, "local-steps": 2, "eval-every": 1,
                          "output-dir": str(tmp_path / "out")}, num_clients=4)
    assert json.loads((out / "summary.json").read_text())["evaluated_rounds"] == 2


def test_cifar10_colour_images_come_channels_first(tmp_path):
    labels = np.arange(40) % 10
    stored = files.write_hub_folder(tmp_path, "img", "label", labels, (32, 32, 3))
    cfg = ExperimentConfig(dataset="cifar10", data_source="huggingface", hub_dataset=str(tmp_path), partition="iid")
    c = load_client_data(cfg, 0, 2)
    assert tuple(c.x_train.shape[1:]) == (3, 32, 32)
    # every sample is one of the stored images, moved to CHW and scaled to [-1, 1]
    chw = (stored.transpose(0, 3, 1, 2).astype(np.float32) / 127.5) - 1.0
    assert all(any(np.array_equal(x, s) for s in chw) for x in c.x_test.numpy())
