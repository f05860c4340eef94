"""Checkpoints: atomic, code-free files; a run killed after a checkpoint resumes to exactly the
numbers of a run that was never interrupted (in-process here; a real SIGKILL under ``flwr run``
in test_e2e_flwr_run.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import server_apps.recording as recording
from flower_pfl.engine.disk_store import DiskClientModelStore
from flower_pfl.engine.memory import Blocks
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.experiment.config import ConfigError, ExperimentConfig
from flower_pfl.experiment.models import DNN
from flower_pfl.methods.registry import client_algorithm_for, entries
from flower_pfl.run import tensor_files
from flower_pfl.run.cost import COST_KEYS
from flower_pfl.run.results import CHECKPOINT
from server_apps.inprocess import run_in_process
from tests.methods.runs import model_for

SETTING = {"num-rounds": 6, "clients-per-round": 4, "local-steps": 3, "eval-every": 2, "checkpoint-every": 2, "seed": 5,
           "model": "dnn", "figures": False}
NODES = 8


def test_pack_unpack_round_trip_keeps_types_and_ids():
    state = {"ids": [3, 1], "rows": torch.arange(6.0).view(2, 3), "per_client": {7: torch.ones(2), "a": torch.zeros(1)},
             "nested": [{"x": 1.5, "y": None, "z": "s"}, (True, 2)], "grid": torch.zeros(0)}
    tensors: dict = {}
    meta = json.loads(json.dumps(tensor_files.pack(state, "s", tensors)))
    back = tensor_files.unpack(meta, tensors)
    assert back["ids"] == [3, 1] and set(back["per_client"]) == {7, "a"} and back["nested"] == [{"x": 1.5, "y": None, "z": "s"}, (True, 2)]
    assert torch.equal(back["rows"], state["rows"]) and torch.equal(back["per_client"][7], torch.ones(2))
    with pytest.raises(TypeError, match="cannot checkpoint"):
        tensor_files.pack(object(), "o", {})


def test_a_crash_while_writing_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / CHECKPOINT
    tensor_files.write(path, {"w": torch.ones(3)}, {"round": 1})

    def crash(*args, **kwargs):
        Path(args[1]).write_bytes(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(tensor_files, "save_file", crash)
    with pytest.raises(OSError):
        tensor_files.write(path, {"w": torch.zeros(3)}, {"round": 2})
    tensors, meta = tensor_files.read(path)
    assert meta == {"round": 1} and torch.equal(tensors["w"], torch.ones(3))


def test_a_tensor_written_block_by_block_reads_back_as_safetensors_writes_it(tmp_path):
    """Every client's model at the end of a run is written a few clients at a time: the file is safetensors',
    the same tensors and metadata as one written whole."""
    rows = torch.arange(35.0).view(7, 5) / 3
    blocks = Blocks((7, 5), lambda: (rows[i:i + 3] for i in range(0, 7, 3)))
    tensor_files.write(tmp_path / "blocks.safetensors", {"rows": blocks, "initial": torch.ones(5)}, {"ids": [4, 2]})
    tensor_files.write(tmp_path / "whole.safetensors", {"rows": rows, "initial": torch.ones(5)}, {"ids": [4, 2]})
    (got, meta), (want, want_meta) = (tensor_files.read(tmp_path / f"{n}.safetensors") for n in ("blocks", "whole"))
    assert meta == want_meta == {"ids": [4, 2]} and got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want)
    short = Blocks((7, 5), lambda: iter([rows[:3]]))
    with pytest.raises(ValueError, match="rows: its blocks hold 60 bytes"):
        tensor_files.write(tmp_path / "short.safetensors", {"rows": short}, {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocks.safetensors", "whole.safetensors"]  # nothing half-written


def _client_keeps_state(entry) -> bool:
    """Whether the clients of ``entry`` keep state between rounds (read from what the server sends)."""
    if entry.builtin:
        return False
    model = model_for(entry.label)
    cfg = ExperimentConfig(method=entry.method, aggregation=entry.aggregation, clients_per_round=2, model=model)
    server = MethodServer(entry.declaration(**cfg.method_arguments()), 2)
    server.initialize({k: v.numpy() for k, v in DNN(3, 2, hidden=2, batch_norm=model == "dnn-bn").state_dict().items()})
    config = server.plan_training(1, [1, 2, 3])[0].config
    return client_algorithm_for(config).keeps_state


STATEFUL = [e for e in entries() if _client_keeps_state(e)]


@pytest.fixture(autouse=True)
def client_state_dir(tmp_path, monkeypatch):
    """Where the clients keep their state between runs (the node's own disk)."""
    monkeypatch.setenv("FLOWER_PFL_CLIENT_STATE_DIR", str(tmp_path / "client-state"))
    return tmp_path / "client-state"


class Killed(Exception):
    """The server process dying mid-run."""


def _run(tmp_path: Path, label: str, api: str, **extra) -> Path:
    method, _, aggregation = label.partition("+")
    return run_in_process({**SETTING, "model": model_for(label), "method": method, "aggregation": aggregation or "default",
                           "api": api, "output-dir": str(tmp_path), **extra}, num_clients=NODES)


def _numbers(folder: Path) -> tuple[list, list, dict]:
    # the cost figures differ: timings and memory are measured, and a resumed run's instructions say it resumed
    rows = [{k: v for k, v in json.loads(line).items() if k != "elapsed_s" and k not in COST_KEYS}
            for line in (folder / "metrics.jsonl").read_text().splitlines()]
    clients = (folder / "clients.jsonl").read_text().splitlines()
    tensors, meta = tensor_files.read(folder / CHECKPOINT)
    return rows, clients, {"round": meta["round"], "server": meta["server"], "arrays": meta["arrays"],
                           "tensors": {k: v.tolist() for k, v in tensors.items()}}


def _interrupted(tmp_path: Path, label: str, api: str, monkeypatch, crash_round: int = 5, **extra) -> Path:
    """Run until the server dies at the start of ``crash_round`` (after the checkpoint of round 4),
    then resume from the results folder."""
    original = recording._Schedule.before_round

    def dying(self, server_round, arrays):
        original(self, server_round, arrays)
        if server_round == crash_round:
            raise Killed

    monkeypatch.setattr(recording._Schedule, "before_round", dying)
    with pytest.raises(Killed):
        _run(tmp_path, label, api, **extra)
    monkeypatch.setattr(recording._Schedule, "before_round", original)
    (folder,) = list(tmp_path.iterdir())
    _, meta = tensor_files.read(folder / CHECKPOINT)
    assert meta["round"] == 4
    assert _run(tmp_path, label, api, **extra, **{"resume-from": str(folder)}) == folder
    return folder


@pytest.mark.parametrize("entry", entries(), ids=[e.label for e in entries()])
def test_resumed_run_gives_the_numbers_of_an_uninterrupted_one(tmp_path, monkeypatch, entry):
    """Every method, including those whose clients keep state (they get it back from their disk)."""
    whole = _run(tmp_path / "whole", entry.label, "message")
    resumed = _interrupted(tmp_path / "resumed", entry.label, "message", monkeypatch)
    assert _numbers(resumed) == _numbers(whole)
    assert json.loads((resumed / "summary.json").read_text())["bmta"] == json.loads((whole / "summary.json").read_text())["bmta"]


@pytest.mark.parametrize("label", ["fedmcsa", "fedper"])
def test_a_store_written_a_chunk_at_a_time_resumes_to_the_numbers_of_an_uninterrupted_one(tmp_path, monkeypatch, label):
    """A store larger than ``CHUNK_BYTES`` (here two clients' heads) goes into the checkpoint and the final
    models a chunk at a time: the same numbers, models and checkpoint as a run that wrote it whole."""
    import flower_pfl.engine.memory as memory
    from flower_pfl.run.results import MODELS, load_models

    whole = _run(tmp_path / "whole", label, "message")
    monkeypatch.setattr(memory, "CHUNK_BYTES", 2 * 4 * 210)  # two clients of FedPer's head (the DNN's fc2)
    written, write = [], tensor_files._write_blocks
    monkeypatch.setattr(tensor_files, "_write_blocks", lambda *a: written.append(a[0].name) or write(*a))
    resumed = _interrupted(tmp_path / "resumed", label, "message", monkeypatch)
    assert any(name.startswith(f".{CHECKPOINT}") for name in written) and any(name.startswith(f".{MODELS}") for name in written)
    assert _numbers(resumed) == _numbers(whole)
    (ids, rows, _), (ids_whole, rows_whole, _) = load_models(resumed / MODELS), load_models(whole / MODELS)
    assert ids == ids_whole and torch.equal(rows, rows_whole)


@pytest.mark.parametrize("label", ["fedmcsa", "fedacs+default", "local"])
def test_a_disk_store_run_resumes_to_the_numbers_and_models_of_an_uninterrupted_one(tmp_path, monkeypatch, label):
    """The server dies at the start of round 6: round 5 overwrote models after the checkpoint of round 4,
    and the resumed run rolls the disk store back to that checkpoint."""
    extra = {"store": "disk"}
    whole = _run(tmp_path / "whole", label, "message", **extra)
    resumed = _interrupted(tmp_path / "resumed", label, "message", monkeypatch, crash_round=6, **extra)
    assert _numbers(resumed)[:2] == _numbers(whole)[:2]
    a, b = DiskClientModelStore.open(whole / "store"), DiskClientModelStore.open(resumed / "store")
    assert a.ids() == b.ids() and torch.equal(a.get(a.ids()), b.get(b.ids()))


@pytest.mark.parametrize("api", ["message", "legacy"])
def test_resumed_run_with_independent_starting_models_gives_the_numbers_of_an_uninterrupted_one(tmp_path, monkeypatch, api):
    """Clients first sampled after the checkpoint get their own starting models again, from seed and partition id."""
    extra = {"init": "independent", "clients-per-round": 2, "eval-every": 6}  # evaluated after the checkpoint only
    whole = _run(tmp_path / "whole", "fedmcsa", api, **extra)
    resumed = _interrupted(tmp_path / "resumed", "fedmcsa", api, monkeypatch, **extra)
    assert _numbers(resumed) == _numbers(whole)
    participants = np.load(resumed / "attention_rounds.npz")["ids"]  # each round's, from the attention record
    assert set(participants[4:].ravel()) - set(participants[:4].ravel())  # some first trained after the resume


def test_clients_keep_only_the_versions_a_checkpoint_needs(tmp_path, monkeypatch, client_state_dir):
    assert {e.label for e in STATEFUL} >= {"scaffold", "ditto", "apfl", "pfedme", "igfl", "igfl-c"}
    folder = _run(tmp_path, "scaffold", "message", **{"num-rounds": 7, "checkpoint-every": 3})
    (run,) = client_state_dir.glob(folder.name + "-*")  # the results folder's name and a random token
    partitions = list(run.glob("partition-*"))
    assert len(partitions) == NODES
    for partition in partitions:  # when a client last wrote (round r), the server's last checkpoint was of
        rounds = sorted(int(p.name[len("round-"):-len(".safetensors")]) for p in partition.glob("round-*.safetensors"))
        last_checkpoint = (rounds[-1] - 1) // 3 * 3  # round ((r - 1) // 3) * 3: of the versions up to it, only the newest is needed
        assert len([r for r in rounds if r <= last_checkpoint]) <= 1, (partition.name, rounds)
    assert any(len(list(p.glob("round-*.safetensors"))) < 3 for p in partitions)


def test_without_its_state_a_resumed_client_would_differ(tmp_path, monkeypatch, client_state_dir):
    """The persisted client state is what makes a stateful method's resumption exact."""
    import shutil

    whole = _run(tmp_path / "whole", "scaffold", "message")
    original = recording._Schedule.before_round

    def dying(self, server_round, arrays):
        original(self, server_round, arrays)
        if server_round == 5:
            raise Killed

    monkeypatch.setattr(recording._Schedule, "before_round", dying)
    with pytest.raises(Killed):
        _run(tmp_path / "resumed", "scaffold", "message")
    monkeypatch.setattr(recording._Schedule, "before_round", original)
    (folder,) = list((tmp_path / "resumed").iterdir())
    state = client_state_dir / tensor_files.read(folder / CHECKPOINT)[1]["run-key"]
    shutil.rmtree(state / "partition-2")  # one client lost its disk
    with pytest.raises(ConfigError, match=f"1 node lacks .*partition 2: no client state of round [1-4] \\(to 4\\) in {state}/partition-2"):
        _run(tmp_path / "resumed", "scaffold", "message", **{"resume-from": str(folder)})
    shutil.rmtree(state)  # all of them
    with pytest.raises(ConfigError, match=f"{NODES} nodes lack"):
        _run(tmp_path / "resumed", "scaffold", "message", **{"resume-from": str(folder)})
    _run(tmp_path / "resumed", "scaffold", "message", **{"resume-from": str(folder), "allow-empty-client-state": True})
    assert _numbers(folder)[0] != _numbers(whole)[0]


def test_a_second_resume_from_a_copy_of_the_folder_is_refused_when_the_first_pruned_the_state_it_needs(
        tmp_path, monkeypatch, client_state_dir):
    """Killed after the checkpoint of round 4 and resumed to the end, the nodes dropped the versions of round
    4 and before; resuming an untouched copy of the killed run's folder would start them empty."""
    import shutil

    original = recording._Schedule.before_round

    def dying(self, server_round, arrays):
        original(self, server_round, arrays)
        if server_round == 5:
            raise Killed

    monkeypatch.setattr(recording._Schedule, "before_round", dying)
    with pytest.raises(Killed):
        _run(tmp_path / "runs", "ditto", "message", **{"num-rounds": 12})
    monkeypatch.setattr(recording._Schedule, "before_round", original)
    (folder,) = list((tmp_path / "runs").iterdir())
    copy = shutil.copytree(folder, tmp_path / "copy" / folder.name)
    _run(tmp_path / "runs", "ditto", "message", **{"num-rounds": 12, "resume-from": str(folder)})
    with pytest.raises(ConfigError, match="nodes lack the client state this checkpoint needs"):
        _run(tmp_path / "copy", "ditto", "message", **{"num-rounds": 12, "resume-from": str(copy)})


@pytest.mark.parametrize("label", ["fedmcsa", "fedavgm", "ditto"])
def test_resumed_legacy_run_gives_the_numbers_of_an_uninterrupted_one(tmp_path, monkeypatch, label):
    whole = _run(tmp_path / "whole", label, "legacy")
    resumed = _interrupted(tmp_path / "resumed", label, "legacy", monkeypatch)
    assert _numbers(resumed)[:2] == _numbers(whole)[:2]


def test_resuming_with_another_config_is_refused_naming_what_differs(tmp_path):
    folder = _run(tmp_path, "fedmcsa", "message", **{"num-rounds": 2})
    with pytest.raises(ConfigError, match="'fedmcsa-sigma' = 10.0 \\(checkpoint: 50.0\\)"):
        _run(tmp_path, "fedmcsa", "message", **{"num-rounds": 2, "fedmcsa-sigma": 10.0, "resume-from": str(folder)})
    with pytest.raises(ConfigError, match="'model' = 'mlr' \\(checkpoint: 'dnn'\\)"):
        _run(tmp_path, "fedmcsa", "message", **{"num-rounds": 2, "model": "mlr", "resume-from": str(folder)})
    from server_apps.checkpoints import Resumption

    resumption = Resumption(folder)
    with pytest.raises(ConfigError, match="the model differs"):  # same config, another model definition
        resumption.check(resumption.meta["config"], {"fc1.weight": [20, 61], "fc1.bias": [20]})
    with pytest.raises(ConfigError, match="does not exist"):
        _run(tmp_path, "fedmcsa", "message", **{"resume-from": str(tmp_path / "nowhere")})


def test_resuming_a_finished_run_changes_nothing(tmp_path):
    folder = _run(tmp_path, "fedacs", "message", **{"num-rounds": 2})
    before = _numbers(folder)
    _run(tmp_path, "fedacs", "message", **{"num-rounds": 2, "resume-from": str(folder)})
    assert _numbers(folder) == before
