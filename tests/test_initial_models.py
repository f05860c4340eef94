"""The run config's ``init`` and ``init-scale``: what each client starts from."""

from __future__ import annotations

import logging
from functools import partial

import numpy as np
import pytest
import torch

from benchmarks.fedmcsa_init import round_statistics
from flower_pfl.engine.disk_store import make_store
from flower_pfl.engine.layout import ParamLayout
from flower_pfl.engine.method_server import MethodServer
from flower_pfl.experiment.build import has_hidden_layers, initial_arrays
from flower_pfl.experiment.config import ConfigError, ExperimentConfig
from flower_pfl.run.results import MODELS, load_models
from server_apps.inprocess import run_in_process


def _flat(arrays) -> torch.Tensor:
    return ParamLayout.from_arrays(arrays).flatten(arrays.values())


def test_zero_is_all_zeros_and_shared_is_the_seeded_default_model_scaled():
    cfg = ExperimentConfig(seed=3)
    shared = initial_arrays(cfg)
    torch.manual_seed(3)
    default = torch.nn.Linear(60, 10)  # Synthetic's MLR, built as the model is
    assert np.array_equal(shared["fc.weight"], default.weight.detach().numpy())
    assert all(not a.any() for a in initial_arrays(ExperimentConfig(init="zero", model="dnn")).values())
    half = initial_arrays(ExperimentConfig(seed=3, init_scale=0.5))
    assert all(np.array_equal(half[k], 0.5 * shared[k]) for k in shared)
    # shared does not depend on who asks
    assert all(np.array_equal(initial_arrays(cfg, partition_id=7)[k], shared[k]) for k in shared)


def test_independent_models_differ_by_partition_and_reproduce_by_seed_and_partition():
    cfg = ExperimentConfig(init="independent", seed=3)
    a, again, b = initial_arrays(cfg, 4), initial_arrays(cfg, 4), initial_arrays(cfg, 5)
    other_seed = initial_arrays(ExperimentConfig(init="independent", seed=4), 4)
    assert torch.equal(_flat(a), _flat(again))
    assert not torch.equal(_flat(a), _flat(b)) and not torch.equal(_flat(a), _flat(other_seed))
    assert not torch.equal(_flat(a), _flat(initial_arrays(cfg)))  # the shared model is no client's
    # PyTorch's default scale: |w| <= 1/sqrt(fan_in)
    assert float(np.abs(a["fc.weight"]).max()) <= 1 / np.sqrt(60)
    scaled = initial_arrays(ExperimentConfig(init="independent", seed=3, init_scale=2.0), 4)
    assert torch.allclose(_flat(scaled), 2 * _flat(a))


def test_independent_models_leave_torch_global_random_state_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    initial_arrays(ExperimentConfig(init="independent"), 2)
    assert torch.equal(torch.rand(3), expected)


def test_hidden_layers_are_models_with_more_than_one_weight_matrix():
    assert not has_hidden_layers(initial_arrays(ExperimentConfig(model="mlr")))
    assert has_hidden_layers(initial_arrays(ExperimentConfig(model="dnn")))


@pytest.mark.parametrize("settings, key, says", [
    ({"init": "random"}, "init", "one of shared, zero, independent"),
    ({"init": "independent", "method": "fedavg"}, "init", "applies to fedacs, fedmcsa"),
    ({"init": "independent", "method": "scaffold"}, "init", "starts from one global model"),
    ({"init-scale": 0.0}, "init-scale", "a finite number > 0"),
    ({"init-scale": float("inf")}, "init-scale", "a finite number > 0"),
    ({"init": "zero", "init-scale": 0.5}, "init-scale", "1 with init 'zero'"),
    ({"init": 0}, "init", "of type str"),
])
def test_init_config_errors_name_the_key_and_what_is_allowed(settings, key, says):
    with pytest.raises(ConfigError, match=f"'{key}'") as err:
        ExperimentConfig.from_mapping(settings)
    assert says in str(err.value)


def test_independent_is_accepted_for_every_method_with_per_client_models():
    for method in ("fedmcsa", "fedacs", "fedamp", "local"):
        assert ExperimentConfig(method=method, init="independent").init == "independent"
    assert ExperimentConfig(method="fedavg", aggregation="mcsa", init="independent").label == "fedavg+mcsa"


@pytest.mark.parametrize("kind", ["memory", "disk"])
def test_store_starts_new_clients_from_their_own_rows(kind, tmp_path):
    store = make_store(torch.zeros(2), folder=tmp_path / "store" if kind == "disk" else None)
    asked = []

    def rows(ids):
        asked.append(list(ids))
        return torch.tensor([[float(i), -float(i)] for i in ids])

    store.initial_rows = rows
    assert store.get([3, 5, 3]).tolist() == [[3, -3], [5, -5], [3, -3]]
    store.put([5, 8], torch.tensor([[1.0, 1.0], [2.0, 2.0]]))  # put writes, never asks
    assert store.get([5, 8, 9]).tolist() == [[1, 1], [2, 2], [9, -9]]
    assert asked == [[3, 5], [9]]


def test_store_checks_the_starting_rows_before_changing_anything():
    store = make_store(torch.zeros(3))
    store.initial_rows = lambda ids: torch.zeros(len(ids), 2)
    with pytest.raises(ValueError, match=r"shape \(2, 2\), not \(2, 3\)"):
        store.get(["a", "b"])
    assert len(store) == 0 and store.capacity == 0


def _server(cfg: ExperimentConfig, ranks: dict[int, int]) -> MethodServer:
    server = MethodServer(cfg.entry.declaration(**cfg.method_arguments()), 2)
    server.node_rank = ranks
    if cfg.init == "independent":
        server.initial_by_rank = partial(initial_arrays, cfg)
    server.initialize(initial_arrays(cfg))
    return server


def test_server_gives_each_client_the_model_of_its_partition():
    cfg = ExperimentConfig(init="independent", seed=1)
    server = _server(cfg, {101: 0, 102: 1, 103: 2})
    rows = server.method.store.get([103, 101])
    assert torch.equal(rows[0], _flat(initial_arrays(cfg, 2))) and torch.equal(rows[1], _flat(initial_arrays(cfg, 0)))
    shared = _server(ExperimentConfig(seed=1), {101: 0, 102: 1})
    assert torch.equal(shared.method.store.get([101, 102]), _flat(initial_arrays(ExperimentConfig(seed=1))).expand(2, -1))


def test_per_client_starting_models_need_ranks_and_a_per_client_method():
    server = _server(ExperimentConfig(init="independent"), {101: 0})
    with pytest.raises(RuntimeError, match=r"clients \[202\] have no rank"):
        server.method.store.get([101, 202])
    cfg = ExperimentConfig(method="scaffold")  # one global model
    scaffold = MethodServer(cfg.entry.declaration(**cfg.method_arguments()), 2)
    scaffold.initial_by_rank = partial(initial_arrays, ExperimentConfig(init="independent"))
    with pytest.raises(ValueError, match="starts every client from one model"):
        scaffold.initialize(initial_arrays(cfg))


@pytest.mark.parametrize("init", ["shared", "zero", "independent"])
def test_a_run_starts_the_clients_it_did_not_train_from_what_init_says(init, tmp_path):
    """One round, 2 of 6 clients train, all 6 evaluate: the other 4 keep their starting models."""
    settings = {"init": init, "num-rounds": 1, "clients-per-round": 2, "local-steps": 2, "eval-every": 1, "seed": 2,
                "output-dir": str(tmp_path)}
    out = run_in_process(settings, num_clients=6)
    ids, rows, initial = load_models(out / MODELS)
    cfg = ExperimentConfig.from_mapping(settings)
    expected = {client: _flat(initial_arrays(cfg, client)) for client in ids}  # one node hosts them: ids are partition ids
    kept = [client for client, row in zip(ids, rows) if torch.equal(row, expected[client])]
    assert len(ids) == 6 and len(kept) == 4
    assert torch.equal(initial, _flat(initial_arrays(cfg)))
    if init == "zero":
        assert not initial.any()
    if init == "independent":
        assert len({tuple(expected[client].tolist()) for client in kept}) == 4


def test_zero_init_warns_about_hidden_layers_and_the_update_bound(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    run_in_process({"init": "zero", "model": "dnn", "num-rounds": 1, "clients-per-round": 2, "local-steps": 1,
                    "output-dir": str(tmp_path)}, num_clients=3)
    text = " ".join(r.getMessage() for r in caplog.records)
    assert "cannot break the symmetry" in text and "learns only its output bias" in text and "max-update-ratio = 0 turns it off" in text


def test_round_statistics_recover_fedmcsa_cosines_from_its_attention():
    sigma = 50.0
    # models (1, 0), (0.6, 0.8) and an all-zero one (cosine 0 with everything, itself included)
    cos = torch.tensor([[1.0, 0.6, 0.0], [0.6, 1.0, 0.0], [0.0, 0.0, 0.0]])
    psi = torch.softmax(sigma * cos, dim=1).numpy()
    # round 1: a, b, x all start from zero (init zero: every model of a first round is zero); round 2: c is new
    ids, weights = np.array([["a", "b", "x"], ["a", "b", "c"]]), np.stack([np.full((3, 3), 1 / 3), psi])
    stats = round_statistics(ids, np.array([3, 3]), weights, sigma, zero_first=True)
    assert stats["self_attention"] == pytest.approx([1 / 3, float(np.mean(np.diag(psi)))])
    assert stats["cosine"] == pytest.approx([0.0, (0.6 + 0.6) / 6], abs=1e-5)
    assert np.isnan(stats["self_attention_returning"][0])  # nobody returns in round 1; a and b do in round 2
    assert stats["self_attention_returning"][1] == pytest.approx(float(np.mean(np.diag(psi)[:2])))
    # without zero_first, c's uniform row would read as cosine 1 with a and b
    assert round_statistics(ids[1:], np.array([3]), psi[None], sigma, zero_first=False)["cosine"][0] > 0.2
    diag_only = round_statistics(np.array([["a", "b", "c"]]), np.array([3]), psi[None], None, zero_first=False)
    assert diag_only["cosine"] == [] and len(diag_only["self_attention"]) == 1
