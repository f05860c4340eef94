"""Every method through the real ServerApp/ClientApp code, in one process (no Ray)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from flower_pfl.run.cost import MEASURED
from flower_pfl.run.results import RunFailed
from server_apps.inprocess import run_in_process

SMALL = {"num-rounds": 12, "clients-per-round": 8, "local-steps": 10, "eval-every": 3, "seed": 1}


@pytest.fixture(scope="module")
def run_dirs(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    return {m: run_in_process({**SMALL, "method": m, "output-dir": str(out)}, num_clients=16)
            for m in ("fedavg", "local", "fedmcsa", "fedacs")}  # every method's own short run is in tests/methods


@pytest.fixture(scope="module")
def summaries(run_dirs):
    return {m: json.loads((d / "summary.json").read_text()) for m, d in run_dirs.items()}


def test_every_method_finishes_with_metrics(summaries):
    for method, s in summaries.items():
        assert s["evaluated_rounds"] == 5, method  # rounds 1, 3, 6, 9, 12
        assert 0.05 < s["bmta"] <= 1.0, method


def test_fedmcsa_saves_its_mean_attention(run_dirs):
    saved = np.load(run_dirs["fedmcsa"] / "attention.npz")
    assert sorted(k for k in saved.files if k not in ("ids", "rank")) == ["fc.bias", "fc.weight"]  # MLR's components
    assert sorted(saved["rank"].tolist()) == list(range(16))  # rows ordered by partition id
    assert (run_dirs["fedmcsa"] / "attention.png").exists()
    assert not (run_dirs["local"] / "attention.npz").exists()
    for name in ("fc.weight", "fc.bias"):
        mean = saved[name]
        assert mean.shape == (16, 16) and np.nanmin(mean) >= 0
        assert np.all(np.diag(mean) >= 1 / 8 - 1e-6)  # cos(i, i) = 1 is the row maximum: at least a uniform share


def test_personalization_pays_off_on_synthetic(summaries):
    """Non-IID Synthetic: per-client models beat the single FedAvg model (12 rounds, 16 clients)."""
    assert summaries["fedmcsa"]["bmta"] > summaries["fedavg"]["bmta"] + 0.05
    assert summaries["local"]["bmta"] > summaries["fedavg"]["bmta"] + 0.05
    assert summaries["fedacs"]["bmta"] > summaries["fedavg"]["bmta"] + 0.05


@pytest.mark.parametrize("method", ["fedmcsa", "fedavg"])
def test_same_seed_same_numbers_even_with_random_node_ids(tmp_path, method):
    """A SuperLink gives nodes random ids every run; sampling follows partition ids instead."""
    rng = np.random.default_rng(0)
    summaries = []
    for name, ids in [("a", None), ("b", rng.choice(2**40, 8, replace=False).tolist()),
                      ("c", rng.choice(2**40, 8, replace=False).tolist())]:
        out = run_in_process({**SMALL, "method": method, "num-rounds": 4, "clients-per-round": 3,
                              "output-dir": str(tmp_path / name)}, num_clients=8, num_nodes=8, node_ids=ids)
        summaries.append(json.loads((out / "summary.json").read_text()))
    assert all(s["bmta"] == summaries[0]["bmta"] and s["final_accuracy"] == summaries[0]["final_accuracy"] for s in summaries)


def test_failing_client_does_not_stop_the_round(tmp_path, monkeypatch):
    """A ClientApp that raises for one partition: the round goes on and that client's model is kept. The
    round's clients then train one by one (they could not start as one computation), each with its own
    reply."""
    import client_apps.app as capp

    original = capp.Node.start_fit

    def flaky(self, config, *args):
        if self.partition_id == 0:
            raise RuntimeError("device lost")
        return original(self, config, *args)

    monkeypatch.setattr(capp.Node, "start_fit", flaky)
    out = run_in_process({**SMALL, "num-rounds": 2, "clients-per-round": 4, "output-dir": str(tmp_path)}, num_clients=4)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["phase"] == "train"]
    assert [r["clients-failed"] for r in train] == [1, 1] and [r["clients-accepted"] for r in train] == [3, 3]
    summary = json.loads((out / "summary.json").read_text())
    # 3 of 4 sampled clients replied, fewer than min-evaluated-share 0.8 asks: the run says so
    assert summary["status"] == "degraded" and (summary["short_training_rounds"], summary["short_training_since"]) == (2, 1)
    assert summary["short_evaluated_rounds"] == 0 and "bmta" in summary  # every client was still evaluated
    (why,) = summary["one_by_one_because"]
    assert "device lost" in why


def test_data_scarce_dirichlet_run_with_partial_participation(tmp_path):
    out = run_in_process({**SMALL, "method": "fedacs", "partition": "dirichlet", "dirichlet-alpha": 0.5,
                          "train-samples-per-client": 50, "num-rounds": 3, "clients-per-round": 4,
                          "output-dir": str(tmp_path)}, num_clients=40)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["clients-accepted"] for r in rows if r["phase"] == "train"] == [4, 4, 4]
    assert all(r["clients-evaluated"] == 40 for r in rows if r["phase"] == "evaluate")


def test_run_without_any_successful_evaluation_fails_after_writing_results(tmp_path, monkeypatch):
    import client_apps.app as capp

    def broken(self, config):
        raise RuntimeError("test split unreadable")

    monkeypatch.setattr(capp.Node, "start_evaluate", broken)  # each evaluation, together or one by one
    with pytest.raises(RunFailed, match="no client evaluation produced a finite accuracy"):
        run_in_process({**SMALL, "num-rounds": 2, "output-dir": str(tmp_path)}, num_clients=4)
    (run_dir,) = list(tmp_path.iterdir())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["evaluated_rounds"] == 0 and summary["status"] == "failed"


def test_fedacs_saves_last_round_similarity_grouped_by_label(tmp_path):
    out = run_in_process({**SMALL, "method": "fedacs", "partition": "pathological", "classes-per-client": 2,
                          "num-rounds": 4, "clients-per-round": 6, "output-dir": str(tmp_path)}, num_clients=12)
    snap = np.load(out / "similarity_last_round.npz")
    assert snap["similarity"].shape == (6, 6) and snap["mask"].diagonal().all()
    assert list(snap["labels"]) == sorted(snap["labels"])  # grouped by dominant label
    assert (out / "similarity_last_round.png").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert 0 <= summary["last_round_chance_same_label"] <= 1


def test_igfl_self_attention_heatmap_by_label_set_with_paired_clients(tmp_path):
    """IGFL's Figure 2 setting: 10 clients in twins that share their two label shards, all train."""
    out = run_in_process({**SMALL, "method": "igfl-s", "igfl-attention": "self", "partition": "shards", "paired-clients": True,
                          "num-rounds": 6, "clients-per-round": 10, "output-dir": str(tmp_path)}, num_clients=10)
    saved = np.load(out / "attention.npz")
    mean = saved["model"]
    assert mean.shape == (10, 10) and np.allclose(mean.sum(1), 1.0, atol=1e-5)  # every row is a softmax
    summary = json.loads((out / "summary.json").read_text())
    assert np.isclose(summary["attention_model_chance_same_labels"], 1 / 9)  # each client's twin is the only match
    assert summary["attention_model_strongest_same_labels"] >= 0.8  # self-attention finds the twin (paper: 96%)
    assert (out / "attention.png").exists()
    rounds = np.load(out / "attention_rounds.npz")
    assert rounds["model"].shape == (6, 10, 10) and np.allclose(rounds["model"].sum(2), 1.0, atol=1e-5)


def test_runs_started_in_the_same_second_get_their_own_folders(tmp_path):
    from flower_pfl.experiment.config import ExperimentConfig
    from server_apps.app import run_dir

    cfg = ExperimentConfig(output_dir=str(tmp_path))
    folders = {run_dir(cfg) for _ in range(3)}
    assert len(folders) == 3 and all(f.is_dir() for f in folders)


@pytest.mark.parametrize("method", ["fedavg", "pfedme"])
def test_mcsa_transfer_runs(tmp_path, method):
    out = run_in_process({**SMALL, "method": method, "aggregation": "mcsa", "num-rounds": 3, "output-dir": str(tmp_path)},
                         num_clients=8)
    assert out.name.startswith(f"{method}+mcsa-") and (out / "attention.npz").exists()
    assert json.loads((out / "summary.json").read_text())["evaluated_rounds"] == 2


def test_disk_store_gives_the_numbers_of_the_memory_store(tmp_path):
    """``store = "disk"``: the per-client models live in memory-mapped files of the results folder."""
    from flower_pfl.run.results import load_models

    runs = {store: run_in_process({**SMALL, "num-rounds": 4, "clients-per-round": 4, "store": store,
                                   "output-dir": str(tmp_path / store)}, num_clients=8) for store in ("memory", "disk")}
    assert (runs["disk"] / "store" / "index.json").exists() and not (runs["memory"] / "store").exists()
    numbers = {s: [{k: v for k, v in json.loads(line).items() if k != "elapsed_s" and k not in MEASURED}
                   for line in (d / "metrics.jsonl").read_text().splitlines()]
               for s, d in runs.items()}
    assert numbers["disk"] == numbers["memory"]
    from flower_pfl.engine.disk_store import DiskClientModelStore

    disk = DiskClientModelStore.open(runs["disk"] / "store")  # the models stay there (no full copy at the end)
    ids, rows, _ = load_models(runs["memory"] / "personalized_models.safetensors")
    assert disk.ids() == ids and (disk.get(ids) == rows).all()
    assert not (runs["disk"] / "personalized_models.safetensors").exists()


def test_the_numbers_do_not_depend_on_how_the_clients_are_spread_over_nodes(tmp_path):
    """40 nodes of one client (each trains alone), 4 nodes of 10 and one node of all 40 (each trains its round's
    clients as one computation): the same seed samples the same clients, and every metric and every client's
    evaluation agree within what reordered float32 sums allow; a node's clients keep their own state (SCAFFOLD's
    c_i)."""
    from floats import same_math
    from local_runs import numbers

    settings = {**SMALL, "method": "scaffold", "model": "dnn", "num-rounds": 4, "clients-per-round": 8, "eval-every": 2}
    runs = {nodes: numbers(run_in_process({**settings, "output-dir": str(tmp_path / str(nodes))}, num_clients=40, num_nodes=nodes))
            for nodes in (40, 4, 1)}
    rows, clients = runs[40]
    assert len(rows) == 4 + 3 and len(clients) == 40 * 3  # 4 rounds trained; 1, 2 and 4 evaluated, every client
    for nodes in (4, 1):
        other_rows, other_clients = runs[nodes]
        assert [(r["round"], r["phase"]) for r in other_rows] == [(r["round"], r["phase"]) for r in rows]
        for mine, theirs in zip(other_rows, rows):
            assert {k: v for k, v in mine.items() if isinstance(v, float)} == same_math(
                {k: v for k, v in theirs.items() if isinstance(v, float)}), nodes
        assert [(c["round"], c["partition-id"]) for c in other_clients] == [(c["round"], c["partition-id"]) for c in clients]
        assert [c["accuracy"] for c in other_clients] == same_math([c["accuracy"] for c in clients])


def test_a_round_without_evaluation_counts_no_client_as_silent(tmp_path):
    """Flower's own FedAvg, evaluated in rounds 1, 3 and 4: Flower's loop asks for the evaluation of a round that
    sent none, and no training instruction of that round may be taken for one without a reply."""
    out = run_in_process({**SMALL, "method": "fedavg", "num-rounds": 4, "clients-per-round": 4, "eval-every": 3,
                          "output-dir": str(tmp_path)}, num_clients=8)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["client_failures"] == 0 and summary["failed_nodes"] == 0
    assert "no reply" not in ((out / "failures.log").read_text() if (out / "failures.log").exists() else "")


def test_the_summary_gives_the_clients_test_set_sizes(run_dirs, summaries):
    """min, median and max of the evaluated clients' test sets, and how many have fewer than a handful, from
    each client's latest evaluation in clients.jsonl."""
    from flower_pfl.run.results import HANDFUL

    rows = [json.loads(line) for line in (run_dirs["fedavg"] / "clients.jsonl").read_text().splitlines()]
    latest = {r["partition-id"]: r["num-examples"] for r in rows}
    sizes = sorted(latest.values())
    sizes_in = summaries["fedavg"]["client_test_samples"]
    assert sizes_in == {"min": sizes[0], "median": float(np.median(sizes)), "max": sizes[-1], "clients": 16}
    assert summaries["fedavg"]["clients_with_few_test_samples"] == sum(n < HANDFUL for n in sizes)
