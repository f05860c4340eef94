"""Where a client computes and in what arithmetic: its data copied to the model's device once per run while
the device's share allows (``flower_pfl.experiment.data.placement``), and the run config's ``precision``
(``flower_pfl.engine.precision``). No GPU is needed: PyTorch's ``meta`` device stands in for one."""

from __future__ import annotations

import pytest
import torch

from flower_pfl.engine.precision import computing_in, precision_problem
from flower_pfl.experiment.config import ConfigError, ExperimentConfig
from flower_pfl.experiment.data import ClientData
from flower_pfl.experiment.data.placement import on_device

META = torch.device("meta")


def _data(n: int) -> ClientData:
    return ClientData(torch.randn(n, 4), torch.zeros(n, dtype=torch.int64), torch.randn(2, 4), torch.zeros(2, dtype=torch.int64))


def test_on_the_cpu_a_client_s_data_are_its_own_tensors():
    data = _data(3)
    assert on_device(data, torch.device("cpu")) is data


def test_a_client_s_data_go_to_the_device_once_while_the_device_s_share_allows():
    size = lambda n: (n * 4 + 2 * 4) * 4 + (n + 2) * 8  # bytes of _data(n)
    first, second = _data(10), _data(20)
    budget = size(10) + size(20) - 1  # room for the first, not for both
    kept = on_device(first, META, budget)
    assert kept.x_train.device.type == "meta" and on_device(first, META, budget) is kept  # copied once, then reused
    once, again = on_device(second, META, budget), on_device(second, META, budget)
    assert once is not again and once.x_train.shape == (20, 4)  # beyond the share: a copy for each message


def test_tf32_and_bfloat16_run_on_cuda_only_and_say_so():
    assert precision_problem("float32", torch.device("cpu")) is None
    assert "CUDA only" in precision_problem("bfloat16", torch.device("cpu"))
    assert "one of float32, tf32, bfloat16" in precision_problem("float16", torch.device("cuda"))
    with computing_in("float32", torch.device("cpu")):
        assert not torch.is_autocast_enabled()
    with pytest.raises(ValueError, match="precision = 'float32'"), computing_in("tf32", torch.device("cpu")):
        pass
    with pytest.raises(ConfigError, match="'precision'"):
        ExperimentConfig(precision="bfloat16", device="cpu")
    with pytest.raises(ConfigError, match="'precision'"):
        ExperimentConfig(precision="half")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bfloat16_changes_the_numbers_a_little_and_keeps_float32_parameters(tmp_path):
    import json

    from server_apps.inprocess import run_in_process

    runs = {}
    for precision in ("float32", "bfloat16"):
        folder = run_in_process({"num-rounds": 3, "clients-per-round": 4, "local-steps": 5, "eval-every": 1, "device": "cuda",
                                 "precision": precision, "figures": False, "output-dir": str(tmp_path / precision)}, num_clients=6)
        runs[precision] = json.loads((folder / "summary.json").read_text())
    assert abs(runs["bfloat16"]["final_accuracy"] - runs["float32"]["final_accuracy"]) < 0.1
