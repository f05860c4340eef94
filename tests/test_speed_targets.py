"""The speed-targets benchmark's verdicts from fabricated figures (``benchmarks/speed_targets.py``): each
target's ratio against its goal, and the table that shows them with every figure."""

from __future__ import annotations

from benchmarks import speed_targets
from server_apps.app import PULL_INTERVAL


def _run(seconds: float) -> dict:
    return {"seconds_per_round": seconds, "round_ms": {"min": 1e3 * seconds, "median": 1e3 * seconds, "max": 1e3 * seconds}}


def _results() -> dict:
    bare = {"model": "dnn", "device": "cpu", "per_round": 20, "bare_sequential": 0.17, "bare_batched": 0.04,
            "package_sequential": 0.2, "package_batched": 0.05, "bare_sequential_evaluation": 0.016,
            "bare_batched_evaluation": 0.01, "package_batched_evaluation": 0.03, "flower_evaluation": 0.008}
    return {"bare": [bare], "machine": {"start": "m, load 1", "end": "m, load 2"}, "federation": {"client-resources-num-cpus": 1},
            "floor": {"runs": {"train only": _run(0.1), "train + evaluate": _run(0.2)}, "schedule": {str(PULL_INTERVAL): 0.12}},
            "quick_start": {"runs": {"in process": [_run(0.06), _run(0.07)], "flwr run": [_run(0.125), _run(0.13)]},
                            "in process": 0.065, "flwr run": 0.1275},
            "cnn": {"images": 600, "rounds": 4, "in process, 1 torch thread": _run(8.0), "in process, 2 torch threads": _run(5.0),
                    "flwr run": _run(5.2)}}


def test_each_target_is_its_ratio_against_its_goal():
    verdicts = {t["target"]: t for t in speed_targets.targets(_results())}
    assert verdicts["quick start: `flwr run` / in process (2 nodes)"]["figure"] == "1.96× (Flower's floor alone: 1.85×)"  # 0.1275, 0.12 / 0.065
    assert not verdicts["quick start: `flwr run` / in process (2 nodes)"]["met"]
    above = verdicts["quick start: the package on top of Flower's floor, share of its `flwr run` round"]
    assert above["met"] and above["figure"].startswith("6% ")  # (0.1275 - 0.12) / 0.1275
    assert verdicts["CNN: `flwr run` / in process, 1 torch thread"]["met"]  # 0.65x
    two = verdicts["CNN: `flwr run` / in process, 2 torch threads"]
    assert two["figure"] == "1.04×" and two["met"]  # 5.2 / 5.0 within 1.1
    assert verdicts["DNN: in process / bare batched loop, per round"]["figure"].startswith("1.25×")
    assert verdicts["DNN: in process / bare batched loop, per round"]["met"]
    evaluation = verdicts["DNN: evaluation of 100 clients / bare batched evaluation"]["figure"]
    assert evaluation.startswith("3.00×") and evaluation.endswith("Flower's FedAvg alone on top: 1.80×)")  # (0.01 + 0.008) / 0.01
    assert not verdicts["DNN: evaluation of 100 clients / bare batched evaluation"]["met"]


def test_the_table_shows_every_verdict_and_figure():
    results = _results()
    results["targets"] = speed_targets.targets(results)
    table = speed_targets.render(results)
    assert table.count("| yes |") + table.count("| no |") == len(results["targets"]) == 6  # 2 quick start, 2 CNN, 2 DNN
    assert "| flwr run | 0.125, 0.130 | 0.128 |" in table and "| in process, 2 torch threads | 5.000 |" in table
    assert "Machine at the start: m, load 1" in table and "| dnn | cpu | 0.1700 | 0.0400 |" in table
