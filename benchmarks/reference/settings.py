"""The two shared settings of the reference check (this package vs PFLlib vs FL-bench, and IFCA's authors' code).

Imported by ``export.py`` and ``run.py`` (this package's environment) only; the launchers that run
inside the reference libraries' environments get everything they need on their command line.

Every setting gives every client exactly ``train-samples-per-client`` training samples, so one local
epoch with batch size ``batch-size`` (PFLlib's and FL-bench's unit of local work) is exactly
``local-steps`` minibatches here (``MinibatchStream``: a fresh permutation each round, no repeats),
and aggregation weights by training-set size are equal in all three libraries.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

#: scratch root of the reference check (extracted libraries, their environments, exported data)
SCRATCH = Path(os.environ.get("REFCHECK_DIR", "/tmp/refcheck"))
PFLLIB_ROOT = SCRATCH / "pfllib"
FLBENCH_ROOT = SCRATCH / "flbench"
PFLLIB_PYTHON = SCRATCH / "venv-pfllib" / "bin" / "python"
FLBENCH_PYTHON = SCRATCH / "venv-flbench" / "bin" / "python"
IFCA_ROOT = SCRATCH / "ifca"  # the IFCA authors' code (jichan3751/ifca); runs in this package's venv
IMAGE_DIR = SCRATCH / "data" / "images"  # the generated FashionMNIST-format files (data-dir of setting "images")

SETTINGS: dict[str, dict[str, Any]] = {
    # (a) Synthetic(0.5, 0.5), 100 clients with 100 training samples each, DNN 60-20-10
    "synthetic": {
        "num_nodes": 100,
        "run_config": {
            "dataset": "synthetic", "synthetic-alpha": 0.5, "synthetic-beta": 0.5, "partition": "natural",
            "train-samples-per-client": 100, "train-fraction": 0.75, "seed": 0,
            "model": "dnn", "hidden-units": 20,
            "num-rounds": 100, "clients-per-round": 20, "local-steps": 5, "batch-size": 20, "lr": 0.05,
            "eval-every": 5,
        },
        # main.py: DNN(60, 20, 10) for a name without MNIST/Cifar10; --dnn-logits: its forward without the final
        # log_softmax, which main.py's BaseHeadSplit would otherwise leave inside the shared base (README.md)
        "pfllib": {"dataset": "Synthetic_ref", "model": "DNN", "flags": ["--dnn-logits"]},
        "flbench": {"dataset": "synthetic", "model": "pfl_dnn"},  # FL-bench's own Synthetic loader; model registered by the launcher
    },
    # (b) class-conditional 1x28x28 images in FashionMNIST's raw format, 20 clients, 3 classes each, CNN
    "images": {
        "num_nodes": 20,
        "run_config": {
            "dataset": "fmnist", "data-dir": str(IMAGE_DIR), "partition": "pathological", "classes-per-client": 3,
            "train-samples-per-client": 100, "train-fraction": 0.75, "seed": 0,
            "model": "cnn",
            "num-rounds": 50, "clients-per-round": 10, "local-steps": 5, "batch-size": 20, "lr": 0.05,
            "eval-every": 5,
        },
        "pfllib": {"dataset": "refFMNIST_img", "model": "CNN"},  # "MNIST" in the name: FedAvgCNN(1, 10, dim=1024)
        "flbench": {"dataset": "pfl_images", "model": "avgcnn"},  # FL-bench's FedAvgCNN; data set registered by the launcher
    },
}


def run_config(setting: str) -> dict[str, Any]:
    return dict(SETTINGS[setting]["run_config"])
