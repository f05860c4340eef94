"""What a run cannot do surfaces when it starts, naming the run-config key, before a results folder exists:
an unusable output-dir, a device this machine lacks, data the nodes cannot load; and what the
start-up query of the nodes reports (failed nodes, two nodes with one partition-id)."""

from __future__ import annotations

import logging
import socket
from pathlib import Path
from uuid import uuid4

import image_files as files
import pytest
import torch
from fabricate import set_task_identity
from flwr.app import Error, Message, MetricRecord, RecordDict

from client_apps.flower_internals import unavailable_reply
from flower_pfl.experiment.build import check_device, load_client_data
from flower_pfl.experiment.config import ConfigError, ExperimentConfig
from flower_pfl.experiment.datasets import registry
from server_apps.app import run_dir
from server_apps.cluster import check_cluster_paths
from server_apps.inprocess import run_in_process
from server_apps.node_order import query_nodes

QUICK = {"num-rounds": 1, "clients-per-round": 2, "local-steps": 1, "eval-every": 1}


# --- output-dir ---------------------------------------------------------------------------------------------

def test_output_dir_that_is_a_file(tmp_path):
    (tmp_path / "results").write_text("not a folder")
    with pytest.raises(ConfigError, match=r"run config 'output-dir' = '.*results': is a file, not a folder \(.*\)"):
        run_dir(ExperimentConfig(output_dir=str(tmp_path / "results")))


def test_output_dir_under_a_file(tmp_path):
    """Fails for root too (a file cannot hold folders whatever the permissions)."""
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=r"run config 'output-dir' = '.*file/results': .*\(\[Errno"):
        run_dir(ExperimentConfig(output_dir=str(tmp_path / "file" / "results")))


def _unwritable_folder(tmp_path: Path) -> Path:
    """A folder this process may not create folders in, root included: the top of sysfs on Linux
    (creating anything there is refused to every user); elsewhere a read-only folder (refused to all but root)."""
    sysfs = Path("/sys")
    if (sysfs / "kernel").is_dir():
        return sysfs
    folder = tmp_path / "ro"
    folder.mkdir(mode=0o555)
    return folder


def test_output_dir_not_writable(tmp_path):
    folder = _unwritable_folder(tmp_path)
    with pytest.raises(ConfigError, match=r"'output-dir' = '.*': is not writable \(.*(Permission denied|Operation not permitted)"):
        run_dir(ExperimentConfig(output_dir=str(folder / "results")))


def test_unusable_output_dir_fails_the_run_before_training(tmp_path):
    (tmp_path / "results").write_text("")
    with pytest.raises(ConfigError, match="'output-dir'"):
        run_in_process({**QUICK, "output-dir": str(tmp_path / "results")}, num_clients=2)


# --- device -------------------------------------------------------------------------------------------------

@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)


def test_cuda_without_a_gpu_fails_before_the_results_folder(tmp_path, no_gpu):
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=r"run config 'device' = 'cuda': no CUDA device is visible .*use 'auto' or 'cpu'"):
        run_in_process({**QUICK, "device": "cuda", "output-dir": str(out)}, num_clients=2)
    assert not out.exists()


def test_device_check(monkeypatch, no_gpu):
    check_device("auto")
    check_device("cpu")
    with pytest.raises(ConfigError, match="'device' = 'cuda:0'"):
        check_device("cuda:0")
    with pytest.raises(ConfigError, match=r"'device' = 'mps': no MPS device"):
        check_device("mps")
    with pytest.raises(ConfigError, match="'device' = 'tpu-please': not a device name"):
        check_device("tpu-please")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    check_device("cuda")
    check_device("cuda:1")
    with pytest.raises(ConfigError, match=r"'device' = 'cuda:3': only 2 CUDA device\(s\) are visible"):
        check_device("cuda:3")


# --- data ---------------------------------------------------------------------------------------------------

FMNIST = {"dataset": "fmnist", "partition": "pathological"}


def test_missing_image_files_name_the_keys(tmp_path):
    cfg = ExperimentConfig.from_mapping({**FMNIST, "data-dir": str(tmp_path)})
    with pytest.raises(ConfigError) as err:
        load_client_data(cfg, 0, 2)
    message = str(err.value)
    assert message.startswith(f"run config 'dataset' = 'fmnist': no files under data-dir '{tmp_path}'")
    assert "FashionMNIST/raw/train-images-idx3-ubyte" in message and message.endswith("set 'data-dir' or 'download = true'")


def test_expected_files_are_those_torchvision_reads(tmp_path):
    files.write_fashion_mnist(tmp_path, 2, 2)
    files.write_emnist(tmp_path, "digits", 2, 2, classes=10)
    files.write_cifar10(tmp_path, per_batch=2)
    for name, split in (("fmnist", "byclass"), ("emnist", "digits"), ("cifar10", "byclass")):
        assert all((tmp_path / f).is_file() for f in registry.instance(name, {"emnist-split": split}).expected_files()), name


def test_missing_data_fails_at_start_before_the_results_folder(tmp_path, monkeypatch):
    import server_apps.app as server

    trained = []
    monkeypatch.setattr(server, "RunRecorder", lambda *a, **k: trained.append(a))  # never reached
    out = tmp_path / "out"
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError) as err:
        run_in_process({**QUICK, **FMNIST, "data-dir": str(tmp_path / "empty"), "output-dir": str(out)}, num_clients=3, num_nodes=3)
    message = str(err.value)
    assert message.startswith("no node could serve this run config; nodes 1001, 1002, 1003: ")
    assert f"on host {socket.gethostname()}: run config 'dataset'" in message  # the machine, for a Ray cluster
    assert "run config 'dataset' = 'fmnist': no files under data-dir" in message and message.count("FashionMNIST/raw") == 4
    assert not out.exists() and not trained


# --- the start-up query -------------------------------------------------------------------------------------

class QueryGrid:
    """Nodes answering the query with ``answers[node](message)``; ids are set as Flower's grids set them."""

    def __init__(self, answers) -> None:
        set_task_identity()
        self.answers = answers

    def get_node_ids(self) -> list[int]:
        return list(self.answers)

    def send_and_receive(self, messages, *, timeout=None) -> list[Message]:
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = uuid4().hex  # what the grid does when pushing
        return [reply for msg in messages if (reply := self.answers[msg.metadata.dst_node_id](msg)) is not None]


def partition(pid: int):
    return lambda msg: Message(RecordDict({"metrics": MetricRecord({"partition-id": pid, "dominant-label": 0,
                                                                    "label-counts": [1, 2]})}), reply_to=msg)


def fails(reason: str):
    return lambda msg: Message(Error(code=1, reason=reason), reply_to=msg)


def unavailable(msg: Message) -> Message:
    """The error the SuperLink itself answers for a node that went away (from node 1, the SuperLink)."""
    return unavailable_reply(msg.metadata, "node_unavail")


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_query_maps_replies_to_nodes(caplog):
    info = query_nodes(QueryGrid({7: partition(1), 3: partition(0)}))
    assert {node: i["partition-id"] for node, i in info.items()} == {7: 1, 3: 0}
    assert info[3] == {"partition-id": 0, "dominant-label": 0, "label-counts": [1, 2]}
    assert not warnings(caplog)


def test_query_fails_when_no_node_answers(caplog):
    bad = "<class 'flower_pfl.experiment.config.ConfigError'>:<'run config 'dataset' = 'fmnist': no files'>"  # as a SuperNode reports it
    grid = QueryGrid({11: fails(bad), 12: fails(bad), 13: unavailable, 14: fails(bad)})
    with pytest.raises(ConfigError) as err:
        query_nodes(grid)
    message = str(err.value)
    assert message.startswith("no node could serve this run config; nodes 11, 12, 14: ConfigError: run config 'dataset' = "
                              "'fmnist': no files; node 13: ")
    assert message.count("'dataset'") == 1  # one line per distinct reason
    assert "node 1:" not in message and "nodes 1," not in message  # the SuperLink's reply is node 13's


def ray_reason(pid: int) -> str:
    """How a simulation reports a ClientApp's exception: a traceback that names the worker process."""
    return (f"<class 'ray.exceptions.RayTaskError(ClientAppException)'>:<'ray::ClientAppActor.run() (pid={pid}, ip=10.0.0.1)\n"
            "  File \"client_apps/app.py\", line 158, in query\nflwr.clientapp.client_app.ClientAppException: \n"
            "Exception ClientAppException occurred. Message: run config 'dataset' = 'fmnist': no files'>")


def test_simulation_errors_from_different_workers_are_one_reason():
    grid = QueryGrid({1: fails(ray_reason(100)), 2: fails(ray_reason(200)), 3: fails(ray_reason(100))})
    with pytest.raises(ConfigError, match=r"^no node could serve this run config; nodes 1, 2, 3: run config 'dataset' = 'fmnist': "
                                          r"no files$"):
        query_nodes(grid)


def test_query_warns_per_distinct_error_when_some_nodes_answer(caplog):
    grid = QueryGrid({1: partition(0), 2: fails("disk full"), 3: fails("disk full"), 4: unavailable, 5: partition(1)})
    info = query_nodes(grid)
    assert sorted(info) == [1, 5]
    logged = warnings(caplog)
    assert "nodes 2, 3 failed to answer the start-up query: disk full" in logged
    assert any(w.startswith("node 4 failed to answer the start-up query: ") for w in logged)
    assert "3 of 5 nodes did not report a partition-id; they are sampled after the others" in logged
    assert len(logged) == 3


def test_query_without_replies_only_warns(caplog):
    assert query_nodes(QueryGrid({1: lambda msg: None, 2: lambda msg: None})) == {}  # timed out: no reasons to give
    assert warnings(caplog) == ["2 of 2 nodes did not report a partition-id; they are sampled after the others"]


def test_two_nodes_claiming_one_partition_are_named(caplog):
    info = query_nodes(QueryGrid({21: partition(0), 22: partition(1), 23: partition(1), 24: partition(2)}))
    assert len(info) == 4
    (warning,) = warnings(caplog)
    assert warning.startswith("nodes 22, 23 all report partition-id 1: they train on the same data")


def test_long_node_lists_are_shortened(caplog):
    query_nodes(QueryGrid({n: partition(0) for n in range(100, 110)}))
    (warning,) = warnings(caplog)
    assert warning.startswith("nodes 100, 101, 102, 103, 104 and 5 more all report partition-id 0")


@pytest.mark.parametrize("key,value,extra", [("data-dir", "data", {**FMNIST}), ("client-state-dir", "state", {}),
                                             ("hub-dataset", "./femnist", {"dataset": "femnist", "data-source": "huggingface"})])
def test_a_cluster_run_refuses_a_relative_folder_naming_the_key(key, value, extra):
    cfg = ExperimentConfig.from_mapping({**extra, key: value})
    with pytest.raises(ConfigError, match=f"'{key}' = '{value}' is invalid on a Ray cluster \\(RAY_ADDRESS=10.0.0.1:6379\\)"):
        check_cluster_paths(cfg, {"RAY_ADDRESS": "10.0.0.1:6379"})
    check_cluster_paths(cfg, {})  # one machine: relative to where the run started, as before
    check_cluster_paths(cfg, {"RAY_ADDRESS": "local"})
    absolute = ExperimentConfig.from_mapping({**extra, key: "/" + value.lstrip("./")})
    check_cluster_paths(absolute, {"RAY_ADDRESS": "10.0.0.1:6379"})
