"""Sweeps (flower_pfl.tools.sweep) and comparisons of finished runs (flower_pfl.tools.compare)."""

from __future__ import annotations

import contextlib
import csv
import json
import re
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from flower_pfl.experiment.config import ConfigError, ExperimentConfig
from flower_pfl.tools import compare, superlink, sweep, sweep_grid
from flower_pfl.tools.sweep_flwr import run_config_text

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
SWEEPS = ROOT / "benchmarks" / "sweeps"


def _sweep(text: str) -> sweep_grid.Sweep:
    return sweep_grid.from_mapping(tomllib.loads(text))


# --- grid expansion and the sweep file ----------------------------------------------------------

def test_cells_are_settings_times_methods_times_seeds_with_precedence(tmp_path):
    s = _sweep("""
methods = ["fedmcsa", "fedavg+mcsa"]
seeds = [0, 1]
[base]
num-rounds = 7
fedmcsa-lambda = 1.0
num-nodes = 12
[grid]
dirichlet-alpha = [0.1, 0.5]
model = ["mlr", "dnn"]
[[settings]]
name = "iid"
partition = "iid"
[[settings]]
name = "skewed"
partition = "dirichlet"
num-nodes = 30
[method.fedmcsa]
fedmcsa-lambda = 2.0
""")
    cells = s.cells(tmp_path)
    assert len(cells) == 2 * 4 * 2 * 2 * 2  # named settings × grid points × (methods + references) × seeds
    assert s.all_methods == ["fedmcsa", "fedavg+mcsa", "local", "fedavg"]  # references default on in a file
    names = list(dict.fromkeys(c.setting for c in cells))
    assert names[:2] == ["iid, dirichlet-alpha=0.1, model=mlr", "iid, dirichlet-alpha=0.1, model=dnn"]
    assert names[-1] == "skewed, dirichlet-alpha=0.5, model=dnn" and len(names) == 8
    first = cells[0]
    assert (first.method, first.seed, first.num_nodes) == ("fedmcsa", 0, 12)
    assert first.run_config["fedmcsa-lambda"] == 2.0 and first.run_config["num-rounds"] == 7  # method table over base
    assert first.run_config["partition"] == "iid" and first.run_config["dirichlet-alpha"] == 0.1
    assert "num-nodes" not in first.run_config
    mcsa = next(c for c in cells if c.method == "fedavg+mcsa")
    assert (mcsa.run_config["method"], mcsa.run_config["aggregation"], mcsa.run_config["fedmcsa-lambda"]) == ("fedavg", "mcsa", 1.0)
    skewed = next(c for c in cells if c.setting.startswith("skewed"))
    assert skewed.num_nodes == 30 and skewed.run_config["partition"] == "dirichlet"
    assert first.folder == tmp_path.resolve() / "runs" / "fedmcsa" / "iid_dirichlet-alpha=0.1_model=mlr" / "seed0"
    assert first.run_config["output-dir"] == str(first.folder)
    assert len({c.folder for c in cells}) == len(cells)


def test_command_line_sets_base_values_and_grid_axes():
    base, grid = sweep_grid.parse_set(["num-rounds=3", "dirichlet-alpha=0.1,0.5", "partition=dirichlet", "download=true"])
    assert base == {"num-rounds": 3, "partition": "dirichlet", "download": True}
    assert grid == {"dirichlet-alpha": [0.1, 0.5]}
    with pytest.raises(sweep_grid.SweepError, match="key=value"):
        sweep_grid.parse_set(["num-rounds"])


def test_command_line_replaces_the_files_lists(tmp_path):
    path = tmp_path / "alpha.toml"
    path.write_text('methods = ["fedmcsa"]\nseeds = [0]\n[grid]\ndirichlet-alpha = [0.1, 0.5]\n')
    args = ["--methods", "fedacs,ditto", "--seeds", "3,4", "--references", "", "--set", "dirichlet-alpha=1.0"]
    s = sweep._sweep_from_args(sweep.parser().parse_args([str(path), *args]))
    assert (s.name, s.methods, s.seeds, s.references) == ("alpha", ["fedacs", "ditto"], [3, 4], [])
    assert s.grid == {} and s.base == {"dirichlet-alpha": 1.0}  # a single value takes the axis out of the grid


def test_narrowing_the_methods_keeps_only_their_own_method_tables(tmp_path):
    path = tmp_path / "all.toml"
    path.write_text('methods = ["fedbn", "fedproto"]\nseeds = [0]\nreferences = []\n[method.fedbn]\nmodel = "dnn-bn"\n'
                    '[method.fedproto]\nfedproto-lambda = 0.5\n')
    s = sweep._sweep_from_args(sweep.parser().parse_args([str(path), "--methods", "fedproto"]))
    assert s.methods == ["fedproto"] and s.method_tables == {"fedproto": {"fedproto-lambda": 0.5}}
    assert [c.run_config["fedproto-lambda"] for c in s.cells(tmp_path / "out")] == [0.5]


@pytest.mark.parametrize("text,error,message", [
    ('methods = ["fedmcsa"]\nseeds = [0', sweep_grid.SweepError, "not valid TOML"),
    ('methods = ["fedmcsa"]\nseeds = [0]\nrounds = 3', sweep_grid.SweepError, "unknown sweep-file key"),
    ('methods = ["fedmcsa"]', sweep_grid.SweepError, "needs 'methods' and 'seeds'"),
    ('methods = []\nseeds = [0]', sweep_grid.SweepError, "non-empty list of method names"),
    ('methods = ["fedmcsa"]\nseeds = [0, 0]', sweep_grid.SweepError, "seed twice"),
    ('methods = ["fedmcsa"]\nseeds = [-1]', sweep_grid.SweepError, "integers >= 0"),
    ('methods = ["fedmcsa"]\nseeds = [0]\n[base]\ndirichlet-alfa = 1.0', ConfigError, "did you mean dirichlet-alpha"),
    ('methods = ["fedmcsa"]\nseeds = [0]\n[base]\nseed = 1', sweep_grid.SweepError, "set by 'seeds'"),
    ('methods = ["fedmcsa"]\nseeds = [0]\n[grid]\nmethod = ["fedavg"]', sweep_grid.SweepError, "'methods' or a"),
    ('methods = ["fedmcsa"]\nseeds = [0]\n[grid]\nlr = 0.1', sweep_grid.SweepError, "non-empty list of values"),
    ('methods = ["fedmcsa"]\nseeds = [0]\n[[settings]]\npartition = "iid"', sweep_grid.SweepError, "own 'name'"),
    ('methods = ["fedmcsa"]\nseeds = [0]\n[method.ditto]\nditto-lambda = 0.1', sweep_grid.SweepError, "names no method"),
])
def test_bad_sweep_files_say_what_to_fix(tmp_path, text, error, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(error, match=message):
        sweep_grid.from_toml(path)


@pytest.mark.parametrize("extra,message", [
    ('[base]\nlr = -1.0', r"'lr' = -1.0 is invalid: must be a number > 0 \(method 'fedmcsa', setting 'base'\)"),
    ('[grid]\nmodel = ["mlr", "resnet"]', r"'model' = 'resnet' is invalid.*setting 'model=resnet'"),
    ('[base]\nnum-nodes = 0', "'num-nodes' = 0 is invalid"),
    ('[method.fedmcsa]\nmethod = "nope"', "'method' = 'nope' is invalid"),
])
def test_bad_values_fail_before_anything_runs(tmp_path, extra, message):
    s = _sweep(f'methods = ["fedmcsa"]\nseeds = [0]\nreferences = []\n{extra}')
    with pytest.raises(ConfigError, match=message):
        sweep.run(s, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


# --- the benchmark scripts' grids as sweep files -----------------------------------------------

def _comparable(run_config: dict) -> dict:
    cfg = ExperimentConfig.from_mapping({**ExperimentConfig().to_run_config(), **run_config}).to_run_config()
    return {k: v for k, v in cfg.items() if k not in ("output-dir", "data-dir")}


@pytest.mark.parametrize("toml,recorded,kind", [
    ("fedmcsa_table1", "fedmcsa_table1", "table"), ("fedacs_scarce", "fedacs_scarce_synthetic", "table"),
    ("igfl_settings", "igfl_synthetic", "table"), ("igfl_figure2", "igfl_synthetic", "figure2"),
    ("fedattn_stability", "fedattn_synthetic", "table"),
])
def test_sweep_files_reproduce_the_recorded_grids(tmp_path, toml, recorded, kind):
    """Every cell of the sweep file is one run of the published benchmark (same run config and clients)."""
    cells = sweep_grid.from_toml(SWEEPS / f"{toml}.toml").cells(tmp_path)
    jobs = [j for j in json.loads((RESULTS / recorded / "results.json").read_text())["runs"] if j.get("kind", "table") == kind]

    def key(config: dict, clients: int) -> str:  # a cell's run config names its clients (num-clients), a job's its nodes
        return json.dumps({**{k: v for k, v in _comparable(config).items() if k != "num-clients"}, "clients": clients}, sort_keys=True)

    assert sorted(key(c.run_config, c.num_nodes) for c in cells) == sorted(key(j["overrides"], j["num_nodes"]) for j in jobs)


def _published(path: Path) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in path.read_text().splitlines()
            if line.startswith("| ") and not line.startswith("| Method")]


def _figures(recorded: str, by=None) -> dict[tuple[str, str], compare.Row]:
    return {(r.setting, r.method): r for r in compare.group(compare.load([RESULTS / recorded]), by)}


def test_fedmcsa_table1_numbers_come_out_as_published():
    labels = {"FedAvg": "fedavg", "FedProx": "fedprox", "Local": "local", "FedMCSA": "fedmcsa"}
    rows = _figures("fedmcsa_table1")
    published = _published(RESULTS / "fedmcsa_table1" / "table.md")
    assert len(published) == len(rows) == 8
    for method, model, bmta, weighted, last10, *_ in published:
        row = rows[(f"model={model.lower()}", labels[method])]
        assert [compare.fmt(row.values(k)) for k in ("bmta", "bmta_weighted", "last10_mean_accuracy")] == [bmta, weighted, last10]
        assert len(row.runs) == 3


def test_fedacs_scarce_numbers_come_out_as_published():
    labels = {"FedACS": "fedacs", "FedAvg": "fedavg", "Local": "local", "FedMCSA": "fedmcsa"}
    rows = _figures("fedacs_scarce_synthetic")
    published = _published(RESULTS / "fedacs_scarce_synthetic" / "table.md")
    alphas = (0.1, 0.5, 1.0, 5.0, 10.0)
    assert len(published) == 4 and len(rows) == 20
    for method, *cells in published:
        assert [compare.fmt(rows[(f"dirichlet-alpha={a}", labels[method])].values("bmta")) for a in alphas] == cells


def test_igfl_numbers_come_out_as_published():
    """IGFL's figure: the sample-weighted last-10% mean, per named setting."""
    rows = _figures("igfl_synthetic")
    lines = (RESULTS / "igfl_synthetic" / "table.md").read_text().splitlines()
    settings = [c.strip() for c in lines[0].strip("|").split("|")][1:]
    labels = {"FedAvg": "fedavg", "FedAvgM": "fedavgm", "SCAFFOLD": "scaffold", "FedAdam": "fedadam",
              "IGFL-C": "igfl-c", "IGFL-S": "igfl-s", "IGFL": "igfl"}
    published = [row for row in _published(RESULTS / "igfl_synthetic" / "table.md") if row[0] in labels]
    assert len(published) == 7
    for method, *cells in published:
        assert [compare.fmt(rows[(s, labels[method])].values("last10_mean_accuracy_weighted")) for s in settings] == cells


# --- tables and grouping from fabricated results folders ---------------------------------------

def _fabricate(folder: Path, config: dict, summary: dict, curve: dict[int, float] | None = None, cell: dict | None = None) -> Path:
    """A results folder as a run leaves it (``summary`` without ``status``: a completed one)."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "summary.json").write_text(json.dumps({"status": "completed", **summary}))
    rows = [{"round": r, "phase": "evaluate", "accuracy-mean": a} for r, a in (curve or {}).items()]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if cell is not None:
        (folder.parent / "cell.json").write_text(json.dumps(cell))
    return folder


def _summary(bmta: float, weighted: float, last10: float, final: float) -> dict:
    return {"bmta": bmta, "bmta_weighted": weighted, "last10_mean_accuracy": last10,
            "last10_mean_accuracy_weighted": weighted - 0.1, "final_accuracy": final}


def test_table_is_mean_and_std_over_seeds_in_percent(tmp_path):
    cfg = {"method": "fedmcsa", "aggregation": "default", "dirichlet-alpha": 0.1}
    _fabricate(tmp_path / "a", {**cfg, "seed": 0}, _summary(0.80, 0.70, 0.75, 0.60))
    _fabricate(tmp_path / "b", {**cfg, "seed": 1}, _summary(0.90, 0.80, 0.85, 0.70))
    _fabricate(tmp_path / "c", {**cfg, "seed": 2}, {"status": "failed", "error": "no client evaluation"})
    rows = compare.report(compare.load([tmp_path / "*"]), tmp_path / "out")
    assert [(r.setting, r.method, len(r.runs)) for r in rows] == [("all runs", "fedmcsa", 2)]  # the failed run is left out
    md = (tmp_path / "out" / "table.md").read_text().splitlines()
    assert md[2] == "| all runs | fedmcsa | 85.00 ± 5.00 | 75.00 ± 5.00 | 80.00 ± 5.00 | 65.00 ± 5.00 | 65.00 ± 5.00 | 2 |"
    (line,) = list(csv.DictReader((tmp_path / "out" / "table.csv").open()))
    assert float(line["bmta_mean_pct"]) == pytest.approx(85.0) and float(line["final_accuracy_std_pct"]) == pytest.approx(5.0)
    assert line["seeds"] == "2"


def test_grouping_by_method_and_the_keys_that_differ(tmp_path):
    def run(name, method, alpha, seed, lam=5.0):
        cfg = {"method": method, "aggregation": "default", "dirichlet-alpha": alpha, "seed": seed, "fedmcsa-lambda": lam,
               "output-dir": str(tmp_path / name), "num-rounds": 10}
        _fabricate(tmp_path / name, cfg, _summary(0.5 + alpha, 0.5, 0.5, 0.5))

    run("m1", "fedmcsa", 0.1, 0, lam=1.0)  # fedmcsa-lambda differs between methods only: it names the method, not a setting
    run("m2", "fedmcsa", 0.1, 1, lam=1.0)
    run("m3", "fedmcsa", 0.3, 0, lam=1.0)
    run("a1", "fedavg", 0.1, 0)
    run("a2", "fedavg", 0.3, 0)
    runs = compare.load([tmp_path])
    assert compare.setting_keys(runs) == ["dirichlet-alpha"]
    rows = compare.group(runs)
    assert [(r.setting, r.method, len(r.runs)) for r in rows] == [
        ("dirichlet-alpha=0.1", "fedavg", 1), ("dirichlet-alpha=0.1", "fedmcsa", 2),
        ("dirichlet-alpha=0.3", "fedavg", 1), ("dirichlet-alpha=0.3", "fedmcsa", 1)]
    assert compare.fmt(rows[1].values("bmta")) == "60.00 ± 0.00"
    run("m4", "fedmcsa", 0.3, 1, lam=2.0)  # fedmcsa-lambda now varies within fedmcsa's runs: a setting key
    assert compare.setting_keys(compare.load([tmp_path])) == ["dirichlet-alpha", "fedmcsa-lambda"]
    pooled = compare.group(compare.load([tmp_path]), by=["method", "num-rounds"])  # --by: only these keys
    assert [(r.setting, r.method, len(r.runs)) for r in pooled] == [("num-rounds=10", "fedavg", 2), ("num-rounds=10", "fedmcsa", 4)]


def test_compare_command_writes_the_report(tmp_path, capsys):
    for seed in (0, 1):
        _fabricate(tmp_path / "runs" / f"ditto-{seed}", {"method": "ditto", "seed": seed}, _summary(0.5, 0.5, 0.5, 0.5),
                   curve={1: 0.2, 2: 0.5})
    compare.main([str(tmp_path / "runs" / "ditto-*"), "--out", str(tmp_path / "out")])
    assert "| all runs | ditto | 50.00 ± 0.00 |" in capsys.readouterr().out
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"table.md", "table.csv", "curves.png"}
    with pytest.raises(FileNotFoundError, match="no results folder"):
        compare.load([tmp_path / "nothing-*"])


def test_curves_are_the_mean_and_range_over_seeds_on_rounds_all_evaluated(tmp_path):
    runs = [compare.load_folder(_fabricate(tmp_path / str(i), {"method": "local"}, _summary(1, 1, 1, 1), curve=c))
            for i, c in enumerate([{1: 0.2, 3: 0.4, 5: 0.9}, {1: 0.4, 3: 0.8}])]
    rounds, mean, low, high = compare.seed_band(runs)
    assert rounds == [1, 3]
    np.testing.assert_allclose(mean, [0.3, 0.6])
    np.testing.assert_allclose(low, [0.2, 0.4])
    np.testing.assert_allclose(high, [0.4, 0.8])
    assert compare.plot(compare.group(runs), tmp_path / "curves.png") and (tmp_path / "curves.png").stat().st_size > 1000
    assert compare.seed_band([compare.Run("local", {}, {})]) is None  # runs without a folder (benchmark records)


# --- resuming ----------------------------------------------------------------------------------

@pytest.fixture
def fake_engine(monkeypatch):
    """Cells 'run' in a thread: each writes a results folder whose BMTA is 0.5 + seed / 10."""
    calls = []

    def task(cell):
        calls.append((cell.method, cell.seed))
        _fabricate(cell.folder / f"run-{len(calls)}", cell.run_config, _summary(0.5 + cell.seed / 10, 0.5, 0.5, 0.5),
                   curve={1: 0.5})
        return {"status": "completed", "results_dir": str(cell.folder / f"run-{len(calls)}")}

    @contextlib.contextmanager
    def executor(engine, workers, out, app):
        with ThreadPoolExecutor(1) as pool:
            yield pool, task

    monkeypatch.setattr(sweep, "_executor", executor)
    return calls


def test_a_finished_cell_is_skipped_and_a_killed_or_failed_one_rerun(tmp_path, fake_engine):
    s = _sweep('methods = ["fedmcsa"]\nseeds = [0, 1, 2]\nreferences = ["local"]\n[base]\nnum-rounds = 3')
    out = tmp_path / "sweep"
    cells = {(c.method, c.seed): c for c in s.cells(out)}
    _fabricate(cells["fedmcsa", 0].folder / "done", cells["fedmcsa", 0].run_config, _summary(0.9, 0.9, 0.9, 0.9))
    killed = cells["fedmcsa", 1].folder / "killed"
    killed.mkdir(parents=True)
    (killed / "config.json").write_text(json.dumps(cells["fedmcsa", 1].run_config))  # no summary: it was killed
    _fabricate(cells["fedmcsa", 2].folder / "failed", cells["fedmcsa", 2].run_config, {"status": "failed"})
    stale = dict(cells["local", 0].run_config, **{"num-rounds": 99})  # another run config: not this cell's result
    _fabricate(cells["local", 0].folder / "other", stale, _summary(0.1, 0.1, 0.1, 0.1))

    record = sweep.run(s, out, progress=False)
    assert sorted(fake_engine) == [("fedmcsa", 1), ("fedmcsa", 2), ("local", 0), ("local", 1), ("local", 2)]
    assert [c.get("skipped", False) for c in record["cells"]] == [True, False, False, False, False, False]
    assert record["cells"][0]["summary"]["bmta"] == 0.9
    table = (out / "table.md").read_text()
    assert "| base | fedmcsa | 73.33 ± 12.47 |" in table  # 0.9, 0.6, 0.7: mean 0.7333, population std 0.1247
    assert "| base | local | 60.00 ± 8.16 |" in table
    assert json.loads((cells["local", 2].folder / "cell.json").read_text()) == {
        "method": "local", "setting": "base", "seed": 2, "num-nodes": 100}

    fake_engine.clear()
    sweep.run(s, out, progress=False)  # everything done: nothing runs again
    assert fake_engine == []
    moved = out.rename(tmp_path / "moved")
    again = compare.report(compare.load([moved]), tmp_path / "compared")  # compare reads the moved sweep: same table
    assert (tmp_path / "compared" / "table.md").read_text() == table and len(again) == 2
    sweep.run(s, moved, progress=False)  # the moved sweep is still complete
    assert fake_engine == []


def test_flwr_run_gets_the_run_config_as_toml():
    assert run_config_text({"method": "fedmcsa", "lr": 0.02, "num-rounds": 3, "paired-clients": False, "lam": 1e-5}) == \
        'method="fedmcsa" lr=0.02 num-rounds=3 paired-clients=false lam=1e-05'
    assert tomllib.loads(run_config_text({"a": "x y", "b": 1e-5}).replace(" b=", "\nb=")) == {"a": "x y", "b": 1e-5}
    # JSON in a string (strategy-args) goes as a literal string: Flower's parser takes no escaped quotes
    assert run_config_text({"strategy-args": '{"k": "v"}'}) == 'strategy-args=\'{"k": "v"}\''
    assert tomllib.loads(run_config_text({"s": '{"k": "v"}'})) == {"s": '{"k": "v"}'}


# --- one real sweep ------------------------------------------------------------------------------

def test_tiny_real_sweep_table_matches_each_cells_summary(tmp_path):
    s = _sweep("""
methods = ["fedmcsa"]
seeds = [0, 1]
references = ["local"]
[base]
num-rounds = 3
clients-per-round = 2
eval-every = 1
local-steps = 2
device = "cpu"
num-nodes = 3
""")
    out = tmp_path / "sweep"
    record = sweep.run(s, out, progress=False)
    assert [c["status"] for c in record["cells"]] == ["completed"] * 4
    with (out / "table.csv").open() as fh:
        rows = {r["method"]: r for r in csv.DictReader(fh)}
    assert set(rows) == {"fedmcsa", "local"}
    for method, row in rows.items():
        summaries = [json.loads((out / c["results_dir"] / "summary.json").read_text())
                     for c in record["cells"] if c["method"] == method]
        assert row["seeds"] == "2" and row["setting"] == "base"
        for key, _ in compare.COLUMNS:
            assert float(row[f"{key}_mean_pct"]) == pytest.approx(100 * np.mean([x[key] for x in summaries]), abs=1e-9)
            assert float(row[f"{key}_std_pct"]) == pytest.approx(100 * np.std([x[key] for x in summaries]), abs=1e-9)
    md = (out / "table.md").read_text()
    assert re.search(r"^\| base \| fedmcsa \| [\d.]+ ± [\d.]+ \|", md, re.M) and "| base | local |" in md
    assert (out / "curves.png").stat().st_size > 1000
    cells = json.loads((out / "sweep.json").read_text())["cells"]
    assert [(c["method"], c["seed"], c["num-nodes"]) for c in cells] == [("fedmcsa", 0, 3), ("fedmcsa", 1, 3), ("local", 0, 3), ("local", 1, 3)]
    assert all(c["run_config"]["num-rounds"] == 3 for c in cells)


def test_a_sweep_runs_data_and_models_of_ones_own_by_import_path(tmp_path):
    s = _sweep("""
methods = ["fedavg"]
seeds = [0]
references = []
[base]
dataset = "tests.own_cases:features"
partition = "natural"
num-rounds = 2
clients-per-round = 2
local-steps = 2
figures = false
num-nodes = 4
[grid]
model = ["dnn", "tests.own_cases:net"]
""")
    record = sweep.run(s, tmp_path / "sweep", progress=False)
    assert [c["status"] for c in record["cells"]] == ["completed"] * 2
    assert sorted(c["run_config"]["model"] for c in record["cells"]) == ["dnn", "tests.own_cases:net"]
    assert all(c["summary"]["client_groups"]["3"] == "sensor3" for c in record["cells"])


def test_a_cell_that_fails_is_recorded_and_the_command_says_so(tmp_path, capsys):
    """lr = 1e30: every update is refused, the run fails; the sweep goes on, records why and exits non-zero."""
    out = tmp_path / "sweep"
    args = ["--methods", "fedmcsa", "--set", "lr=1e30", "--set", "num-rounds=2", "--set", "num-nodes=2",
            "--set", "clients-per-round=2", "--set", "eval-every=2", "--out", str(out)]
    with pytest.raises(SystemExit, match="1 cell\\(s\\) failed"):
        sweep.main(args)
    (cell,) = json.loads((out / "sweep.json").read_text())["cells"]
    assert cell["status"] == "failed" and "RunFailed" in cell["error"] and cell["summary"] is None
    assert "no completed cell" in capsys.readouterr().out and not (out / "table.md").exists()


@pytest.mark.e2e
def test_flwr_run_engine_gives_the_in_process_figures(tmp_path):
    """The same cell through `flwr run` (a private SuperLink, stopped afterwards) and in-process."""
    s = _sweep('methods = ["fedmcsa"]\nseeds = [0]\nreferences = []\n[base]\nnum-rounds = 2\nnum-nodes = 3\n'
               'clients-per-round = 2\neval-every = 1\nbatch-clients = false')  # one by one: the same bits on 2 nodes and on 1
    by_flwr = sweep.run(s, tmp_path / "flwr", engine="flwr-run", progress=False)["cells"][0]
    in_process = sweep.run(s, tmp_path / "inprocess", progress=False)["cells"][0]
    assert by_flwr["status"] == in_process["status"] == "completed", by_flwr.get("error")
    assert by_flwr["summary"]["bmta"] == in_process["summary"]["bmta"]
    assert (tmp_path / "flwr" / by_flwr["cell_dir"] / "flwr.log").exists()
    assert not superlink.processes(f"flower-superlink.*{tmp_path / 'flwr'}")
