"""The aggregation-speed benchmark at a tiny size: every method of the registry is timed, the
ratios are real numbers, and FedAMP's precision check reads models and results folders."""

from __future__ import annotations

import json
import math

import pytest
import torch

from benchmarks import aggregation_speed as agg
from flower_pfl.methods.registry import method_classes
from flower_pfl.run.results import MODELS, save_models


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """One tiny run of the command line, written to a folder: ``(table.md, results.json)``."""
    out = tmp_path_factory.mktemp("aggregation_speed")
    agg.main(["--sizes", "tiny", "--repeats", "1", "--run-rounds", "--out", str(out)])
    return (out / "table.md").read_text(), json.loads((out / "results.json").read_text())


def test_every_method_class_is_timed_with_a_positive_finite_ratio(written):
    table, results = written
    rows = results["rows"]
    assert {cls.name for cls in method_classes()} <= {r["name"] for r in rows}
    assert {r["method"] for r in rows} >= {agg.LIMIT, agg.FLOWER_FEDAVG, "IGFL (time attention)"}
    for r in rows:
        assert (r["m"], r["d"]) == (4, 1000)
        assert math.isfinite(r["ratio"]) and r["ratio"] > 0 and r["ms"] > 0, r
    assert [r["ratio"] for r in rows if r["method"] == agg.LIMIT] == [1.0]
    for r in rows:  # one line per row, the limit in ms only
        cell = f"{r['ms']:.2f} ms" if r["method"] == agg.LIMIT else f"{r['ms']:.2f} ms ({r['ratio']:.2f}×)"
        assert f"| {r['method']} | {cell} |" in table or f"| **{r['method']}** | {cell} |" in table
    assert "| method | m=4, d=1,000 |" in table
    assert results["fedamp_precision"][0]["data"] == "random m=4, d=1,000"
    assert results["device"] == "cpu" and "on cpu" in table


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is visible")
def test_a_gpu_asked_for_where_there_is_none_is_refused(capsys):
    with pytest.raises(SystemExit) as stop:
        agg.main(["--sizes", "tiny", "--device", "cuda"])
    assert stop.value.code == 2 and "no CUDA device is visible" in capsys.readouterr().err


def test_a_method_round_is_split_into_its_parts_and_its_one_off_costs(written):
    fedmcsa = next(r for r in written[1]["rows"] if r["name"] == "fedmcsa")
    assert fedmcsa["aggregate_ms"] > 0 and fedmcsa["plan_ms"] > 0 and fedmcsa["setup_ms"] > 0 and fedmcsa["first_round_ms"] > 0


def test_the_table_is_made_at_the_paper_sizes_without_arguments():
    """As another script calls it (``aggregation_table()``)."""
    import inspect

    bound = inspect.signature(agg.aggregation_table).bind()
    bound.apply_defaults()
    assert list(bound.arguments["sizes"]) == [(20, 100_000), (100, 100_000), (500, 100_000), (100, 1_000_000)]


def test_format_table_puts_methods_in_rows_and_sizes_in_columns():
    rows = [{"method": "A", "m": 2, "d": 10, "ms": 3.0, "ratio": 1.5}, {"method": agg.LIMIT, "m": 2, "d": 10, "ms": 2.0, "ratio": 1.0},
            {"method": "A", "m": 4, "d": 10, "ms": 8.0, "ratio": 2.0}, {"method": agg.LIMIT, "m": 4, "d": 10, "ms": 4.0, "ratio": 1.0}]
    assert agg.format_table(rows).splitlines() == [
        "| method | m=2, d=10 | m=4, d=10 |", "|---|---|---|",
        "| A | 3.00 ms (1.50×) | 8.00 ms (2.00×) |", f"| **{agg.LIMIT}** | 2.00 ms | 4.00 ms |"]


@pytest.mark.parametrize("d", [22, 1000, 10_000, 100_000, 1_000_000])
def test_the_mlp_layout_has_exactly_d_parameters_in_two_layers(d):
    layout = agg.mlp_layout(d)
    assert layout.dim == d and layout.names == ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")
    (h, n_in), _, (classes, h2), _ = layout.shapes
    assert h == h2 and classes == agg.CLASSES and n_in >= 1
    for small in (21, 10, 3):
        with pytest.raises(ValueError, match="too small"):
            agg.mlp_layout(small)


def test_two_gemm_is_the_softmax_of_cosines_times_the_models():
    u = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    w = torch.softmax(torch.eye(2), dim=1)  # orthogonal rows: cos = identity
    torch.testing.assert_close(agg.two_gemm(u), w @ u)


def test_fedamp_reference_by_hand_and_float32_close_to_it():
    w = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0]])
    ref = agg.fedamp_reference(w, alpha_k=0.1, sigma=2.0)
    a01, a02 = 0.1 * math.exp(-1 / 2) / 2, 0.1 * math.exp(-4 / 2) / 2
    assert math.isclose(float(ref[0, 1]), a01) and math.isclose(float(ref[0, 0]), 1 - a01 - a02)
    gaps = agg.fedamp_precision(w, alpha_k=0.1, sigma=2.0)
    assert gaps["xi_float64"] < 1e-7 and gaps["xi_cdist"] < 1e-7 and gaps["u_cdist"] < 1e-6
    assert math.isclose(gaps["xi_offdiag_max"], max(a01, 0.1 * math.exp(-5 / 2) / 2)) and gaps["u_max"] > 0


def test_fedamp_precision_of_a_results_folder_in_groups_of_a_round(tmp_path):
    """A fabricated FedAMP results folder: 5 clients, 2 per round, models sharing a large common part."""
    g = torch.Generator().manual_seed(0)
    rows = 3.0 + 0.01 * torch.randn(5, 50, generator=g)
    save_models(tmp_path / MODELS, list(range(5)), rows, torch.zeros(50))
    (tmp_path / "config.json").write_text(json.dumps({"fedamp-alpha-k": 1e-3, "fedamp-sigma": 0.005, "clients-per-round": 2}))
    got = agg.results_precision(tmp_path, "fabricated")
    assert (got["data"], got["alpha_k"], got["sigma"]) == ("fabricated", 1e-3, 0.005)
    groups = [agg.fedamp_precision(rows[i:i + 2], 1e-3, 0.005) for i in (0, 2, 4)]
    assert got["xi_cdist"] == max(g["xi_cdist"] for g in groups) < 1e-6
    assert got["xi_offdiag_max"] > 0.01  # weights far from 0: the comparison means something
