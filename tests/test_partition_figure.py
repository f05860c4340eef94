"""The partition figure (``partition.png``): a Flower Datasets partitioner over the label counts the nodes
report at start, whose partitions are exactly the clients' training labels, drawn beside the run's other
figures unless ``figures = false`` or Flower Datasets is missing."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from flwr_datasets.metrics import compute_counts

from flower_pfl.engine import extras
from flower_pfl.experiment.build import dataset_shape, load_client_data
from flower_pfl.experiment.config import ExperimentConfig
from flower_pfl.reports.counts_partitioner import LABEL, CountsPartitioner
from flower_pfl.reports.figures import label_counts
from flower_pfl.run import results
from flower_pfl.run.results import PARTITION, draw_partition
from server_apps.inprocess import run_in_process

COUNTS = np.array([[3, 0, 1], [0, 0, 0], [2, 5, 0], [0, 1, 4], [0, 0, 0]])  # clients 1 and 4 hold nothing
QUICK = {"num-rounds": 1, "clients-per-round": 2, "local-steps": 2, "eval-every": 1}


def test_each_partition_holds_its_clients_counted_labels():
    partitioner = CountsPartitioner(COUNTS)
    assert partitioner.num_partitions == 5 and len(partitioner.dataset) == COUNTS.sum()
    for client, counts in enumerate(COUNTS):
        labels = partitioner.load_partition(client)[LABEL].to_numpy()
        assert np.bincount(labels, minlength=3).tolist() == counts.tolist()
    # Flower Datasets' own count, the figure's numbers: every class a column, an empty client a row of zeros
    assert compute_counts(partitioner, LABEL).to_numpy().tolist() == COUNTS.tolist()
    with pytest.raises(ValueError, match="not one of the 5 partitions"):
        partitioner.load_partition(5)
    with pytest.raises(ValueError, match="clients x classes"):
        CountsPartitioner([[1, -1]])


def test_the_counts_are_by_partition_id_with_zeros_for_a_client_that_did_not_answer():
    by_node = {7: {"partition-id": 2, "num-partitions": 4, "label-counts": [1, 2]},
               9: {"partition-id": 0, "num-partitions": 4, "label-counts": [3, 0]}}
    assert label_counts(by_node).tolist() == [[3, 0], [0, 0], [1, 2], [0, 0]]
    assert label_counts({1: {"partition-id": 0, "num-partitions": 1}}) is None  # another ClientApp reports none


def test_without_flower_datasets_the_figure_is_skipped_and_said(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(extras.importlib.util, "find_spec", lambda name, *a: None if name == "flwr_datasets" else real(name, *a))
    said: list[str] = []
    info = {0: {"partition-id": 0, "num-partitions": 1, "label-counts": [1, 2]}}
    assert not draw_partition(tmp_path, info, log=said.append)
    assert not (tmp_path / PARTITION).exists() and f"{PARTITION} not drawn" in said[0] and "[data]" in said[0]


def test_an_in_process_run_draws_its_clients_training_labels(tmp_path, monkeypatch):
    drawn: list[np.ndarray] = []
    real = results.plot_partition
    monkeypatch.setattr(results, "plot_partition", lambda counts, *a: (drawn.append(counts), real(counts, *a)))
    settings = {**QUICK, "partition": "dirichlet", "dirichlet-alpha": 0.3, "num-clients": 5}
    out = run_in_process({**settings, "output-dir": str(tmp_path)}, num_nodes=2)
    assert (out / PARTITION).stat().st_size > 1000
    cfg = ExperimentConfig.from_mapping(settings)
    own = [torch.bincount(load_client_data(cfg, i, 5).y_train, minlength=dataset_shape(cfg)[1]).tolist() for i in range(5)]
    assert drawn[0].tolist() == own  # the clients' own training data, partition id by partition id


def test_figures_false_draws_no_partition(tmp_path):
    out = run_in_process({**QUICK, "figures": False, "output-dir": str(tmp_path)}, num_clients=3)
    assert (out / "summary.json").exists() and not (out / PARTITION).exists()
