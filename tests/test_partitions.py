"""Partitions over clients (flwr-datasets' partitioners) and data scarcity."""

import numpy as np
import pytest

from flower_pfl.experiment.build import load_client_data
from flower_pfl.experiment.config import ConfigError, ExperimentConfig
from flower_pfl.experiment.data.partition import SCHEMES, keep_train_samples, partition_indices

LABELS = np.random.default_rng(0).integers(0, 10, 4000)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_partitions_are_disjoint_complete_and_seeded(scheme):
    parts = partition_indices(LABELS, 20, scheme, seed=3)
    joined = np.concatenate(parts)
    assert len(parts) == 20 and len(joined) == len(LABELS) and len(np.unique(joined)) == len(LABELS)
    again = partition_indices(LABELS, 20, scheme, seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    other = partition_indices(LABELS, 20, scheme, seed=4)
    assert any(not np.array_equal(a, b) for a, b in zip(parts, other))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_clients_share_of_a_class_is_a_random_sample_of_it(scheme):
    """Index order often means something (pooled Synthetic: one user after another); it must not leak."""
    parts = partition_indices(LABELS, 20, scheme, seed=1, alpha=1000.0)
    positions = np.array([p.mean() / len(LABELS) for p in parts])
    assert np.all(np.abs(positions - 0.5) < 0.15), positions.round(2)  # in index order, client 0 got the first samples


def test_pathological_gives_k_classes_and_shards_equal_sizes():
    for k in (1, 2, 3):
        parts = partition_indices(LABELS, 20, "pathological", classes_per_client=k, seed=0)
        assert {len(np.unique(LABELS[p])) for p in parts} == {k}
    shards = partition_indices(LABELS, 20, "shards", shards_per_client=2, seed=0)
    assert {len(p) for p in shards} == {200}
    assert max(len(np.unique(LABELS[p])) for p in shards) <= 4  # 2 shards of sorted labels, each may straddle a boundary


@pytest.mark.parametrize("n", [10, 7])
def test_paired_clients_are_twins_with_the_same_labels(n):
    parts = partition_indices(LABELS, n, "shards", shards_per_client=2, seed=2, paired=True)
    joined = np.concatenate(parts)
    assert len(parts) == n and len(joined) == len(LABELS) and len(np.unique(joined)) == len(LABELS)
    groups = partition_indices(LABELS, (n + 1) // 2, "shards", shards_per_client=2, seed=2)
    for k, group in enumerate(groups):
        twins = parts[2 * k: 2 * k + 2]
        assert np.array_equal(np.sort(np.concatenate(twins)), np.sort(group))  # the twins split group k
        if len(twins) == 2:
            a, b = (np.bincount(LABELS[t], minlength=10) / len(t) for t in twins)
            assert abs(len(twins[0]) - len(twins[1])) <= 1 and np.abs(a - b).max() < 0.15  # same label mix
    with pytest.raises(ConfigError, match="'paired-clients'"):
        ExperimentConfig.from_mapping({"paired-clients": True})  # the natural partition has no scheme to split


def test_smaller_dirichlet_alpha_means_stronger_label_skew():
    def mean_classes(alpha):
        return np.mean([len(np.unique(LABELS[p])) for p in partition_indices(LABELS, 20, "dirichlet", alpha=alpha, seed=0)])
    assert mean_classes(0.1) < mean_classes(1.0) < mean_classes(100.0) <= 10
    assert min(len(p) for p in partition_indices(LABELS, 20, "dirichlet", alpha=0.1, seed=0)) >= 10  # redrawn until so


def test_keep_train_samples():
    x, y = np.arange(20).reshape(10, 2), np.arange(10)
    xs, ys = keep_train_samples(x, y, 4, np.random.default_rng(0))
    assert len(ys) == 4 and len(set(ys.tolist())) == 4 and np.array_equal(xs[:, 0] // 2, ys)
    assert len(keep_train_samples(x, y, 0, np.random.default_rng(0))[1]) == 10


def test_client_data_with_partition_and_scarcity():
    full = ExperimentConfig(partition="dirichlet", dirichlet_alpha=0.5, seed=1)
    scarce = ExperimentConfig(partition="dirichlet", dirichlet_alpha=0.5, seed=1, train_samples_per_client=50)
    for pid in (0, 7):
        a, b = load_client_data(full, pid, 10), load_client_data(scarce, pid, 10)
        assert b.num_train == min(50, a.num_train) and len(b.y_test) == len(a.y_test)  # test split untouched
        assert set(b.y_train.tolist()) <= set(a.y_train.tolist())
    pathological = [load_client_data(ExperimentConfig(partition="pathological", seed=1), pid, 10) for pid in range(10)]
    assert all(len(set(c.y_train.tolist()) | set(c.y_test.tolist())) == 2 for c in pathological)


def test_partition_config_is_validated():
    with pytest.raises(ConfigError, match="'partition'.*one of natural, iid"):
        ExperimentConfig.from_mapping({"partition": "zipf"})
    with pytest.raises(ConfigError, match="'dirichlet-alpha'"):
        ExperimentConfig.from_mapping({"dirichlet-alpha": 0.0})
    with pytest.raises(ConfigError, match="'train-samples-per-client'"):
        ExperimentConfig.from_mapping({"train-samples-per-client": -5})


def _same(a, b) -> bool:
    return all(np.array_equal(x.numpy(), y.numpy()) for x, y in zip((a.x_train, a.y_train, a.x_test, a.y_test),
                                                                     (b.x_train, b.y_train, b.x_test, b.y_test)))


@pytest.mark.parametrize("partition", ["natural", "dirichlet"])
def test_data_seed_fixes_the_data_and_leaves_the_training_seed_free(partition):
    """Three training seeds on one data set: with ``data-seed`` fixed, every seed gets the same clients' data
    (Synthetic's generation, the partition, the splits); -1 is the run's seed, as before the key existed."""
    fixed = [ExperimentConfig(partition=partition, seed=s, data_seed=5) for s in (0, 1, 2)]
    clients = [[load_client_data(cfg, pid, 10) for pid in (0, 9)] for cfg in fixed]
    assert all(_same(a, b) for other in clients[1:] for a, b in zip(clients[0], other))
    follows = [load_client_data(ExperimentConfig(partition=partition, seed=5), pid, 10) for pid in (0, 9)]
    assert all(_same(a, b) for a, b in zip(clients[0], follows))  # data-seed 5 is the data of seed 5
    other = [load_client_data(ExperimentConfig(partition=partition, seed=1), pid, 10) for pid in (0, 9)]
    assert not all(_same(a, b) for a, b in zip(clients[0], other))  # without it, each seed draws its own data
    assert ExperimentConfig(seed=1, data_seed=5).run_name.endswith("-seed1-data5")
    assert ExperimentConfig(seed=1).run_name.endswith("-seed1")
    with pytest.raises(ConfigError, match="'data-seed' = -2 is invalid"):
        ExperimentConfig.from_mapping({"data-seed": -2})
