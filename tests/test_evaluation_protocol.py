"""The evaluation protocol: each client's validation part, clients that never train and held-out domains.

Splits are checked on the data the clients get; the clients that never train on the messages the server
sends (never a training instruction); every registry entry runs with both in both APIs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import data_files as files
import numpy as np
import pytest
import torch
from flwr.app import Message, MessageType

import server_apps.inprocess as inprocess
from flower_pfl.engine.client_algorithm import CLIENT_ALGORITHM, FINETUNE_STEPS, NEW_CLIENT
from flower_pfl.engine.client_metrics import new_client_metrics, validation_means
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.experiment.clients import client_datasets, data_request, load_client_data
from flower_pfl.experiment.config import ConfigError, ExperimentConfig
from flower_pfl.experiment.data.client_data import validation_indices
from flower_pfl.experiment.unseen import drawn_unseen, held_out, unseen_clients
from flower_pfl.methods.cfl import CFL
from flower_pfl.methods.fedper import FedPer
from flower_pfl.methods.ifca import MODELS, IFCAClient
from flower_pfl.methods.local import Local
from flower_pfl.methods.registry import entries
from flower_pfl.reports.figures import client_accuracies
from flower_pfl.run.cost import COST_KEYS
from server_apps.inprocess import run_in_process
from strategies.client_packs import is_pack, unpack
from tests.methods.runs import model_for

SETTING = {"num-rounds": 2, "clients-per-round": 3, "local-steps": 2, "batch-size": 8, "eval-every": 1, "seed": 3,
           "figures": False, "val-fraction": 0.2, "unseen-fraction": 0.3, "new-client-finetune-steps": 2,
           "fedbabu-finetune-steps": 2, "fedgen-generator-steps": 2, "fedas-alignment-batch-size": 8}
CLIENTS = 6


# --- splits -------------------------------------------------------------------------------------------------

def test_validation_comes_out_of_the_training_part_alone():
    """10 samples, train-fraction 0.6 (indices 0-5 train): a fifth of the share (2 samples) is held out of them,
    at least one stays, and a temporal split keeps its last samples after a gap."""
    rng = np.random.default_rng(0)
    train = np.arange(6)
    rest, val = validation_indices(train, 10, 0.2, rng)
    assert len(val) == 2 and sorted([*rest, *val]) == list(range(6)) and not set(rest) & set(val)
    assert validation_indices(train, 10, 0.0, rng)[0] is train and len(validation_indices(train, 10, 0.0, rng)[1]) == 0
    assert len(validation_indices(train, 10, 0.9, rng)[0]) == 1  # never the whole training part
    rest, val = validation_indices(train, 10, 0.2, rng, temporal=True, gap=2)
    assert list(rest) == [0, 1] and list(val) == [4, 5]  # 2, 3: the gap between overlapping windows
    with pytest.raises(ValueError, match="none to spare"):
        validation_indices(np.arange(1), 4, 0.5, rng)


def _data(**overrides: Any) -> list[Any]:
    cfg = ExperimentConfig.from_mapping({"dataset": "synthetic", "num-clients": 8, **overrides})
    return list(client_datasets(data_request(cfg), 8))


def _rows(x: torch.Tensor) -> set[bytes]:
    return {bytes(row.numpy().tobytes()) for row in x}


@pytest.mark.parametrize("partition", ["natural", "dirichlet"])
def test_a_validation_part_is_disjoint_and_leaves_every_test_part_as_it_was(partition):
    plain, held = _data(partition=partition), _data(partition=partition, **{"val-fraction": 0.2})
    for a, b in zip(plain, held):
        assert torch.equal(a.x_test, b.x_test) and torch.equal(a.y_test, b.y_test)  # the test parts do not move
        assert a.y_val is None and b.has_validation
        train, val, test = _rows(b.x_train), _rows(b.x_val), _rows(b.x_test)
        assert not train & val and not val & test and not train & test
        assert train | val == _rows(a.x_train)  # taken out of the training part, nothing else
        share = len(a.y_train) + len(a.y_test)
        assert len(b.y_val) == max(1, round(0.2 * share))


def test_splits_are_the_same_whoever_loads_them():
    """A node of any layout loads client 3 through the same request: the same parts, to the sample."""
    cfg = ExperimentConfig.from_mapping({"num-clients": 8, "val-fraction": 0.25})
    client_datasets.cache_clear()
    first = load_client_data(cfg, 3, 8)
    client_datasets.cache_clear()
    again = load_client_data(cfg, 3, 8)
    for name in ("x_train", "x_val", "x_test"):
        assert torch.equal(getattr(first, name), getattr(again, name))


def test_a_config_makes_its_data_request_once_and_another_config_its_own():
    cfg = ExperimentConfig.from_mapping({"num-clients": 8, "dirichlet-alpha": 0.3, "partition": "dirichlet"})
    same = ExperimentConfig.from_mapping({"num-clients": 8, "dirichlet-alpha": 0.3, "partition": "dirichlet"})
    other = ExperimentConfig.from_mapping({"num-clients": 8, "dirichlet-alpha": 0.7, "partition": "dirichlet"})
    first = data_request(cfg)
    assert data_request(cfg) is first and data_request(same) == first  # an equal config: an equal request
    assert data_request(other) != first and dict(data_request(other).scheme_options)["alpha"] == 0.7
    assert data_request(cfg) == first


def test_validation_share_is_checked_against_the_training_part():
    with pytest.raises(ConfigError, match="'val-fraction' = 0.8 is invalid: must be a number in \\[0, train-fraction = 0.75\\)"):
        ExperimentConfig.from_mapping({"val-fraction": 0.8})
    with pytest.raises(ConfigError, match="'unseen-fraction' = 1.0 is invalid"):
        ExperimentConfig.from_mapping({"unseen-fraction": 1.0})


# --- who never trains ---------------------------------------------------------------------------------------

def test_the_clients_that_never_train_depend_on_the_federation_and_the_data_seed_alone():
    drawn = drawn_unseen(20, 0.2, 7)
    assert len(drawn) == 4 and drawn == drawn_unseen(20, 0.2, 7) and drawn <= set(range(20))
    assert drawn != drawn_unseen(20, 0.2, 8)
    assert drawn_unseen(20, 0.0, 7) == frozenset() and len(drawn_unseen(3, 0.01, 0)) == 1 and len(drawn_unseen(3, 0.99, 0)) == 2
    cfg = ExperimentConfig.from_mapping({"unseen-fraction": 0.2, "seed": 1, "data-seed": 7})
    assert unseen_clients(cfg, 20, {}) == drawn  # the data's seed, not the run's


def test_held_out_domains_name_their_clients_and_refuse_an_unknown_one():
    groups = {0: "mnist", 1: "svhn", 2: "usps", 3: "mnist", 4: "svhn"}
    assert held_out("svhn", groups) == {1, 4} and held_out(" mnist , usps", groups) == {0, 2, 3}
    with pytest.raises(ConfigError, match="mnistm is no client's domain \\(the clients' domains are mnist, svhn, usps\\)"):
        held_out("mnistm", groups)
    cfg = ExperimentConfig.from_mapping({"unseen-domains": "mnist,svhn,usps"})
    with pytest.raises(ConfigError, match="leave none of the 5 clients to train"):
        unseen_clients(cfg, 5, groups)


def _server(method: Any, unseen=(3, 4), finetune: int = 0) -> MethodServer:
    server = MethodServer(method, 2, seed=1, unseen=unseen, finetune_steps=finetune)
    server.node_rank = {10 + i: i for i in range(6)}
    server.initialize({"w": np.zeros((2, 3), dtype=np.float32), "b": np.zeros(2, dtype=np.float32)})
    return server


def test_a_client_that_never_trains_is_never_sampled_and_is_told_what_it_is():
    server = _server(FedPer(), finetune=5)
    nodes = list(range(10, 16))
    for rnd in range(1, 30):
        assert {ins.client_id for ins in server.plan_training(rnd, nodes)} <= {10, 11, 12, 15}
    plan = list(server.evaluation_plan(30, nodes, 1.0))
    new = {ins.client_id: ins.config for ins in plan if ins.config.get(NEW_CLIENT)}
    assert set(new) == {13, 14} and all(c[FINETUNE_STEPS] == 5 for c in new.values())
    assert all(NEW_CLIENT not in ins.config for ins in plan if ins.client_id not in new)


def test_a_new_client_of_a_per_client_store_evaluates_the_mean_of_the_participants_models():
    """FedPer keeps each client's head: a new client gets the mean head (hand-computed) with the shared body."""
    server = _server(FedPer())
    method = server.method
    heads = {10: [1.0, 2.0], 11: [3.0, 6.0]}
    for cid, head in heads.items():
        model = method.shared_values().clone()
        model[method._own_index(model.device)] = torch.tensor(head).repeat_interleave(method.store.dim // 2)
        method.keep([cid], model[None])
    (ins,) = method.new_client_instructions(1, [13])
    assert torch.allclose(ins.model[method._own_index(ins.model.device)], torch.tensor([2.0, 4.0]).repeat_interleave(method.store.dim // 2))
    assert 13 not in method.store  # never stored
    (local,) = _server(Local()).method.new_client_instructions(1, [13])
    assert torch.equal(local.model, torch.zeros_like(local.model))  # Local shares nothing: the starting model


def test_a_new_cfl_client_chooses_its_cluster_by_its_loss():
    server = _server(CFL())
    (ins,) = [i for i in server.evaluation_plan(1, list(range(10, 16)), 1.0) if i.client_id == 13]
    assert ins.config[CLIENT_ALGORITHM] == IFCAClient.name and len(ins.config[MODELS]) == 4 * server.method.models.numel()


def test_new_client_figures_are_their_own_and_validation_weighs_by_its_samples():
    rows = [{"accuracy": 1.0, "loss": 0.1, "num-examples": 10}, {"accuracy": 0.5, "loss": 0.3, "num-examples": 30}]
    figures = new_client_metrics(rows, [10, 30])
    assert figures["unseen-accuracy-mean"] == 0.75 and figures["unseen-accuracy"] == pytest.approx(0.625)
    assert figures["unseen-clients-evaluated"] == 2 and not any(not k.startswith("unseen-") for k in figures)
    val = validation_means([{"val-accuracy": 1.0, "val-num-examples": 1, "num-examples": 99},
                            {"val-accuracy": 0.0, "val-num-examples": 3, "num-examples": 1}])
    assert val == {"val-accuracy": 0.25}
    band = client_accuracies([{"round": 1, "accuracy": 0.5}, {"round": 1, "accuracy": 0.9, "new-client": True}])
    assert band == {1: [0.5]}  # the learning curve's spread is the participating clients'


# --- whole runs ---------------------------------------------------------------------------------------------

@pytest.fixture
def sent(monkeypatch) -> list[tuple[str, int, dict[Any, Any]]]:
    """Every message the run's server sends: its type, its node and the config of each client it carries."""
    out: list[tuple[str, int, dict[Any, Any]]] = []
    original = inprocess.InProcessGrid._one

    def spy(self: Any, msg: Message) -> Message:
        kind = msg.metadata.message_type
        if kind in (MessageType.TRAIN, MessageType.EVALUATE):
            contents = unpack(msg.content)[0] if is_pack(msg.content) else {None: msg.content}
            out.append((kind, msg.metadata.dst_node_id, {c: _config(x) for c, x in contents.items()}))
        return original(self, msg)

    monkeypatch.setattr(inprocess.InProcessGrid, "_one", spy)
    return out


def _config(content: Any) -> dict[str, Any]:
    for key, record in content.config_records.items():
        if key in ("config", "fitins.config", "evaluateins.config"):
            return dict(record)
    return {}


def _run(tmp_path: Path, label: str, api: str, nodes: int = CLIENTS, **extra: Any) -> Path:
    method, _, aggregation = label.partition("+")
    return run_in_process({**SETTING, "model": model_for(label), "method": method, "aggregation": aggregation or "default",
                           "api": api, "output-dir": str(tmp_path), **extra}, num_clients=CLIENTS, num_nodes=nodes)


def _partitions(folder: Path) -> dict[int, int]:
    """node id -> partition id, from the clients' evaluations."""
    rows = [json.loads(line) for line in (folder / "clients.jsonl").read_text().splitlines()]
    return {int(r["node-id"]): int(r["partition-id"]) for r in rows}


@pytest.mark.parametrize("api", ["message", "legacy"])
@pytest.mark.parametrize("entry", entries(), ids=[e.label for e in entries()])
def test_every_method_runs_with_a_validation_part_and_clients_that_never_train(tmp_path, sent, entry, api):
    folder = _run(tmp_path, entry.label, api)
    summary = json.loads((folder / "summary.json").read_text())
    unseen = set(summary["unseen_partition_ids"])
    assert unseen == drawn_unseen(CLIENTS, 0.3, 3)
    assert summary["unseen_clients"] == len(unseen) and "val_selected_accuracy" in summary and "bottom10_accuracy" in summary
    assert summary["participation_gap"] == pytest.approx(summary["val_selected_accuracy"] - summary["unseen_accuracy"])
    where = _partitions(folder)
    trained = {where[node] for kind, node, _ in sent if kind == MessageType.TRAIN}
    assert trained and not trained & unseen  # never a training instruction
    told = {where[node] for kind, node, configs in sent if kind == MessageType.EVALUATE and configs[None].get(NEW_CLIENT)}
    assert told == unseen
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    for row in (r for r in rows if r["phase"] == "evaluate"):
        assert row["clients-evaluated"] == CLIENTS - len(unseen) and row["unseen-clients-evaluated"] == len(unseen)
        assert 0 <= row["val-accuracy-mean"] <= 1 and 0 <= row["unseen-accuracy-mean"] <= 1
    new = [json.loads(line) for line in (folder / "clients.jsonl").read_text().splitlines() if '"new-client"' in line]
    assert {int(r["partition-id"]) for r in new} == unseen


def test_a_node_hosting_several_clients_never_trains_one_that_never_trains(tmp_path, sent):
    folder = _run(tmp_path, "fedmcsa", "message", nodes=2, **{"all-clients-train": True})
    unseen = set(json.loads((folder / "summary.json").read_text())["unseen_partition_ids"])
    trained = {int(c) for kind, _, configs in sent if kind == MessageType.TRAIN for c in configs}
    assert trained == set(range(CLIENTS)) - unseen  # every client trains every round, but these
    told = {int(c) for kind, _, configs in sent if kind == MessageType.EVALUATE for c, x in configs.items() if x.get(NEW_CLIENT)}
    assert told == unseen


def test_fine_tuning_a_new_client_changes_its_figure_and_nothing_else(tmp_path):
    tuned, plain = _run(tmp_path / "tuned", "fedavg", "message"), _run(tmp_path / "plain", "fedavg", "message",
                                                                        **{"new-client-finetune-steps": 0})
    rows = [[json.loads(line) for line in (f / "metrics.jsonl").read_text().splitlines()] for f in (tuned, plain)]
    drop = lambda r: {k: v for k, v in r.items() if not k.startswith("unseen-") and k not in ("elapsed_s", *COST_KEYS)}  # their instruction grew
    assert [drop(r) for r in rows[0]] == [drop(r) for r in rows[1]]
    evaluated = [(a["unseen-loss"], b["unseen-loss"]) for a, b in zip(*rows) if a["phase"] == "evaluate"]
    assert all(a != b for a, b in evaluated)


def test_held_out_domains_never_train_on_the_digits(tmp_path, sent):
    """Four clients over two domains of the digits, in their publishers' files: the clients of the held-out
    domain never train."""
    pytest.importorskip("torchvision")
    files.write_mnist(tmp_path / "data", 12, 8)
    files.write_usps(tmp_path / "data", 20, 12, seed=2)
    folder = run_in_process({**SETTING, "dataset": "digits", "digits-domains": "mnist,usps", "partition": "iid",
                             "model": "cnn", "unseen-fraction": 0.0, "unseen-domains": "usps", "data-dir": str(tmp_path / "data"),
                             "output-dir": str(tmp_path / "out"), "clients-per-round": 2, "min-evaluated-share": 0.5},
                            num_clients=4, num_nodes=4)
    summary = json.loads((folder / "summary.json").read_text())
    assert {summary["client_groups"][str(p)] for p in summary["unseen_partition_ids"]} == {"usps"}
    where = _partitions(folder)
    assert not {where[node] for kind, node, _ in sent if kind == MessageType.TRAIN} & set(summary["unseen_partition_ids"])


def test_the_splits_and_the_new_clients_are_the_same_in_every_layout(tmp_path):
    """One client per node, three per node, the legacy API: the same clients never train, with the same parts."""
    def parts(folder: Path) -> tuple[list[int], set[tuple[int, float, float, bool]]]:
        rows = [json.loads(line) for line in (folder / "clients.jsonl").read_text().splitlines()]
        return (json.loads((folder / "summary.json").read_text())["unseen_partition_ids"],
                {(int(r["partition-id"]), r["num-examples"], r["val-num-examples"], "new-client" in r) for r in rows})

    layouts = [_run(tmp_path / "one", "ditto", "message"), _run(tmp_path / "three", "ditto", "message", nodes=2),
               _run(tmp_path / "legacy", "ditto", "legacy")]
    first = parts(layouts[0])
    assert all(parts(folder) == first for folder in layouts[1:])


def test_a_resumed_run_keeps_its_new_clients_and_gives_the_uninterrupted_numbers(tmp_path, monkeypatch):
    from test_checkpoint import _interrupted, _numbers
    from test_checkpoint import _run as checkpointed_run

    monkeypatch.setenv("FLOWER_PFL_CLIENT_STATE_DIR", str(tmp_path / "client-state"))  # the nodes' own disk
    extra = {"val-fraction": 0.2, "unseen-fraction": 0.25, "new-client-finetune-steps": 2}
    whole = checkpointed_run(tmp_path / "whole", "fedmcsa", "message", **extra)
    resumed = _interrupted(tmp_path / "resumed", "fedmcsa", "message", monkeypatch, **extra)
    assert _numbers(resumed) == _numbers(whole)
    assert json.loads((resumed / "summary.json").read_text())["unseen_partition_ids"] == \
        json.loads((whole / "summary.json").read_text())["unseen_partition_ids"]


def test_flowers_own_legacy_draw_never_trains_a_new_client_even_when_it_takes_every_trainer():
    """Four clients available, one of them new, a training draw of four (lost nodes left exactly four): the three
    that may train, never the new one; an evaluation draw of all takes all."""
    from flwr.server.client_proxy import ClientProxy

    from flower_pfl.engine.new_clients import NewClients
    from flower_pfl.engine.sampling import Sampler
    from server_apps.seeded import SeededClientManager

    class Proxy(ClientProxy):
        def get_properties(self, *a: Any) -> Any: ...
        def get_parameters(self, *a: Any) -> Any: ...
        def fit(self, *a: Any) -> Any: ...
        def evaluate(self, *a: Any) -> Any: ...
        def reconnect(self, *a: Any) -> Any: ...

    sampler = Sampler(0, {n: n for n in range(4)})
    manager = SeededClientManager(sampler, NewClients(sampler, frozenset({2})))
    for n in range(4):
        manager.register(Proxy(str(n)))
    with manager.drawing_trainers():
        assert [p.cid for p in manager.sample(4)] == [] and [p.cid for p in manager.sample(3)] == ["0", "1", "3"]
    assert [p.cid for p in manager.sample(4)] == ["0", "1", "2", "3"]


def test_a_strategy_in_an_app_of_ones_own_asks_the_ranks_before_any_draw_when_some_clients_never_train():
    from strategies.ranks import prepare_draw

    server = MethodServer(FedPer(), 3, unseen=[1], rank_key="partition-id")
    asked: list[Any] = []
    prepare_draw(server, [10, 11, 12], 3, lambda ids: asked.extend(ids) or [(i, {"partition-id": i - 10}) for i in ids], "{key}")
    assert sorted(asked) == [10, 11, 12] and server.is_unseen(11) and not server.is_unseen(10)


def test_new_clients_have_their_own_weight_cap_and_the_participants_mean_keeps_its_order():
    from strategies.aggregated_metrics import checked_groups

    rows = [(0, {"accuracy": 0.5, "num-examples": 10}), (1, {"accuracy": 1.0, "num-examples": 10}),
            (2, {"accuracy": 0.0, "num-examples": 10_000})]
    kept, new, refused = checked_groups(lambda c: c == 2, rows, "accuracy", max_weight_ratio=2.0)
    assert [r["num-examples"] for _, r in kept] == [10, 10] and new[0][1]["num-examples"] == 10_000 and not refused
    values = [0.9, 0.1, 0.7, 0.3, 0.55, 0.2, 0.8]
    assert new_client_metrics([{"accuracy": v} for v in values], [1.0] * 7)["unseen-accuracy-mean"] == float(np.mean(values))


def test_a_checkpoint_written_before_these_keys_resumes():
    from server_apps.checkpoints import Resumption

    resumption = Resumption.__new__(Resumption)
    resumption.folder, resumption.meta = Path("."), {"layout": {"w": [2]}}
    today = ExperimentConfig().to_run_config()
    resumption.meta["config"] = {k: v for k, v in today.items() if k not in ("val-fraction", "unseen-fraction", "unseen-domains",
                                                                              "new-client-finetune-steps", "target-accuracy")}
    resumption.check(today, {"w": [2]})  # the keys it predates read as their defaults
    with pytest.raises(ConfigError, match="'val-fraction' = 0.2 \\(checkpoint: 0.0\\)"):
        resumption.check({**today, "val-fraction": 0.2}, {"w": [2]})
