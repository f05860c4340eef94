"""A run config's keys, refused where they are unknown and said where they look like another library's
unit: in process (``ExperimentConfig.from_mapping``, which every path reads the run config with) and
from ``python -m flower_pfl check`` before ``flwr run`` starts."""

from __future__ import annotations

import warnings

import pytest

from flower_pfl.experiment.build import load_client_data
from flower_pfl.experiment.config import ConfigError, ExperimentConfig
from flower_pfl.tools import check
from server_apps.inprocess import run_in_process


@pytest.mark.parametrize("key,nearest", [
    ("num-round", "'num-rounds'"), ("feddyn_alpha", "'feddyn-alpha'"), ("Clients-Per-Round", "'clients-per-round'"),
    ("apple-plr", "'apple-p-lr'"),
])
def test_a_misspelt_key_is_refused_naming_the_nearest(key, nearest):
    with pytest.raises(ConfigError, match=f"run config key '{key}' is not a key of flower-pfl; did you mean {nearest}"):
        ExperimentConfig.from_mapping({key: 1})


def test_an_in_process_run_refuses_a_typo_before_it_starts(tmp_path):
    with pytest.raises(ConfigError, match="'apple-dlr'.*did you mean"):
        run_in_process({"method": "apple", "apple-dlr": 0.01, "output-dir": str(tmp_path)}, num_clients=2)
    assert not any(tmp_path.iterdir())  # nothing written


def test_a_percent_written_as_a_fraction_is_said_once_set():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ExperimentConfig.from_mapping({"method": "fedala", "fedala-rand-percent": 0.8})
        ExperimentConfig.from_mapping({"method": "fedala", "fedala-rand-percent": 80.0})
        ExperimentConfig.from_mapping({"method": "fedala"})
    assert [str(w.message) for w in caught] == [
        "run config 'fedala-rand-percent' = 0.8 is a percent: 0.8 % (write 80 for 80 %, which other libraries write "
        "as the fraction 0.8)"]


def test_check_says_every_problem_before_flwr_run(capsys):
    assert check.main(["--run-config", "num-round=5 method='fedala' lr=-1"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "flower-pfl: run config key 'num-round' is not in ./pyproject.toml's [tool.flwr.app.config], so flwr run "
        "refuses it; did you mean 'num-rounds'?",
        "flower-pfl: run config 'lr' = -1.0 is invalid: must be a number > 0"]
    assert check.main(["--run-config", "method='fedala' fedala-rand-percent=0.5"]) == 0  # a warning is no refusal
    assert capsys.readouterr().err == (
        "flower-pfl: warning: run config 'fedala-rand-percent' = 0.5 is a percent: 0.5 % (write 50 for 50 %, which "
        "other libraries write as the fraction 0.5)\n")


def test_check_passes_a_good_run_config_and_reads_flowers_format(capsys, tmp_path):
    overrides = tmp_path / "run.toml"
    overrides.write_text('method = "ditto"\nnum-rounds = 3\n')
    assert check.main(["--run-config", str(overrides)]) == 0
    assert capsys.readouterr().out == "flower-pfl: the run config is good: ditto on synthetic (mlr), 3 rounds, 20 clients per round\n"
    assert check.main([str(tmp_path), "--run-config", "lr=0.1"]) == 2  # no pyproject.toml there
    assert "cannot read the run config" in capsys.readouterr().err


def test_the_documentations_check_commands_pass(capsys):
    import shlex
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    commands = [line.strip() for page in [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
                for line in page.read_text().splitlines() if line.strip().startswith("python -m flower_pfl check")]
    assert commands
    for command in commands:
        assert check.main(shlex.split(command)[4:]) == 0, f"{command}: {capsys.readouterr().err}"


# --- check: from any folder, the data files looked for, the model against the data ---------------------------

def test_check_runs_from_any_folder_on_the_packages_own_run_config(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no pyproject.toml here
    assert check.main(["--run-config", "method='fedavg' num-rounds=3"]) == 0
    assert "the run config is good: fedavg on synthetic" in capsys.readouterr().out
    assert check.main(["--run-config", "num-round=3"]) == 2
    err = capsys.readouterr().err
    assert "'num-round' is not in any run config" in err and "'num-rounds'" in err  # the nearest key


def test_check_looks_for_the_data_files_and_names_the_missing_ones(capsys, tmp_path, monkeypatch):
    import image_files

    monkeypatch.chdir(tmp_path)
    settings = f"dataset='fmnist' partition='iid' model='cnn' data-dir='{tmp_path / 'data'}'"
    assert check.main(["--run-config", settings]) == 2
    err = capsys.readouterr().err
    assert "no files under data-dir" in err and err.count("FashionMNIST/raw/") == 4 and "set 'data-dir' or 'download = true'" in err
    image_files.write_fashion_mnist(tmp_path / "data", 10, 5)
    (tmp_path / "data" / "FashionMNIST" / "raw" / "t10k-images-idx3-ubyte").unlink()
    assert check.main(["--run-config", settings]) == 2
    assert "missing FashionMNIST/raw/t10k-images-idx3-ubyte" in capsys.readouterr().err
    image_files.write_fashion_mnist(tmp_path / "again", 10, 5)
    assert check.main(["--run-config", settings.replace("'data'", "'again'").replace(str(tmp_path / "data"), str(tmp_path / "again"))]) == 0
    assert "the run config is good" in capsys.readouterr().out


def test_check_refuses_a_model_that_cannot_take_the_datas_samples(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert check.main(["--run-config", "model='tests.own_cases:wrong_width'"]) == 2
    err = capsys.readouterr().err
    assert "'tests.own_cases:wrong_width': the model fails on a batch of 2 samples of shape (60,)" in err


# --- check: a natural partition, read and partitioned as the run does it -----------------------------------------

def _refusals(capsys, settings: str, *federation: str) -> str:
    assert check.main(["--run-config", settings, *federation]) == 2
    return capsys.readouterr().err


def test_check_partitions_the_natural_clients_as_the_run_does(capsys, tmp_path, monkeypatch):
    """Omniglot's files holding 3 drawers: 4 clients are refused with the very words the run stops with, whether
    num-clients or the nodes set the number, and without a pixel decoded; 3 clients pass."""
    import image_files
    from PIL import Image

    monkeypatch.chdir(tmp_path)
    image_files.write_omniglot(tmp_path / "data", {"images_background": {"Latin/character01": 3, "Greek/character01": 3},
                                                   "images_evaluation": {"Atlantean/character01": 3}})
    keys = {"dataset": "omniglot", "partition": "natural", "model": "cnn", "min-test-samples": 1, "data-dir": str(tmp_path / "data")}
    settings = " ".join(f"{key}={value!r}" for key, value in keys.items())
    stops = {}
    for clients in (4, 0):  # 4 clients, by num-clients or by the nodes
        with pytest.raises(ConfigError) as run:
            load_client_data(ExperimentConfig.from_mapping({**keys, "num-clients": clients}), 0, 4)
        stops[clients] = f"flower-pfl: {run.value}\n"
    assert "'num-clients' = 4" in stops[4] and "num-supernodes" in stops[0]
    monkeypatch.setattr(Image.Image, "convert", lambda *a, **k: pytest.fail("check decoded an image"))
    assert _refusals(capsys, f"{settings} num-clients=4") == stops[4]
    assert _refusals(capsys, settings, "--federation-config", "num-supernodes=4 client-resources-num-cpus=1") == stops[0]
    assert check.main(["--run-config", f"{settings} num-clients=3"]) == 0
    assert check.main(["--run-config", settings, "--federation-config", "num-supernodes=3"]) == 0
