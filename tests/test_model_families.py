"""Every registry entry on every kind of model: a convolutional network, a ResNet with batch normalization,
a text model and LEAF's character LSTM, each at a small width on data of one's own (``family_data``), for
two rounds. An entry that cannot apply to a model is refused before the run, with the reason the model
table gives (``flower_pfl.experiment.tables.refusals``); every other one completes, with every update
accepted and finite losses."""

from __future__ import annotations

import json

import pytest

from flower_pfl.experiment.config import ConfigError
from flower_pfl.experiment.tables import refusals
from flower_pfl.methods.registry import entries
from server_apps.inprocess import run_in_process

#: the model families, each with its data and a small width
FAMILIES = {
    "cnn": {"dataset": "tests.family_data:images", "model": "cnn", "model-width": 0.125},
    "resnet18": {"dataset": "tests.family_data:images", "model": "resnet18", "model-width": 0.0625},
    "transformer": {"dataset": "tests.family_data:tokens", "model": "transformer", "text-embed-dim": 8, "text-heads": 2,
                    "text-layers": 1},
    "char-lstm": {"dataset": "tests.family_data:tokens", "model": "char-lstm", "model-width": 0.0625},
}
SETTING = {"num-rounds": 2, "clients-per-round": 2, "local-steps": 2, "batch-size": 8, "eval-every": 2, "partition": "iid",
           "seed": 0, "figures": False, "fedbabu-finetune-steps": 2, "fedgen-generator-steps": 2, "fedas-alignment-batch-size": 8}
NODES = 2


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("entry", entries(), ids=[e.label for e in entries()])
def test_every_entry_runs_on_every_model_family_or_is_refused_with_its_reason(entry, family, tmp_path):
    config = {**SETTING, **FAMILIES[family], "method": entry.method, "aggregation": entry.aggregation,
              "output-dir": str(tmp_path)}
    refused = refusals().get(entry.label, {}).get(FAMILIES[family]["model"])
    if refused is not None:
        with pytest.raises(ConfigError, match=f"cannot run on model '{FAMILIES[family]['model']}': it needs"):
            run_in_process(config, num_clients=NODES)
        assert not any(tmp_path.iterdir())
        return
    folder = run_in_process(config, num_clients=NODES)
    summary = json.loads((folder / "summary.json").read_text())
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["phase"] == "train"]
    assert summary["status"] == "completed" and summary["evaluated_rounds"] >= 1
    assert [r["clients-accepted"] for r in train] == [2, 2] and all(0 < r["train-loss"] < 100 for r in train)
    assert 0 <= summary["final_accuracy"] <= 1
