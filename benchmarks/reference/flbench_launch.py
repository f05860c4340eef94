"""Run FL-bench's own ``main.py`` unchanged, in FL-bench's environment, and collect its accuracies.

    /tmp/refcheck/venv-flbench/bin/python benchmarks/reference/flbench_launch.py --root /tmp/refcheck/flbench \
        --out run.json -- method=fedavg dataset.name=synthetic model.name=pfl_dnn common.global_epoch=100 ...
    /tmp/refcheck/venv-flbench/bin/python benchmarks/reference/flbench_launch.py --root ... --verify manifest.json

This file holds none of FL-bench's code. Before FL-bench's Hydra entry point ``main.main()`` runs
(with the given overrides), it uses FL-bench's own extension points, the way its README asks for a
custom model or data set, from the outside:

* model ``pfl_dnn`` in ``src.utils.models.MODELS``: a ``DecoupledModel`` with ``base`` = flatten,
  Linear(d, 20), ReLU and ``classifier`` = Linear(20, 10): the package's DNN 60-20-10 (FL-bench's
  ``2nn`` is 60-200-200-10);
* data set ``pfl_images`` in ``data.utils.datasets.DATASETS`` (and the shape tables of
  ``src.utils.constants`` / ``FedAvgCNN.feature_length``): ``data.npy`` / ``targets.npy`` as written by
  ``export.py``, already scaled as the package feeds them (x / 127.5 - 1), with no further transform;
  FL-bench's ``avgcnn`` (FedAvgCNN: conv 32, conv 64, 1024-512, 512-10) is then exactly the package's ``cnn``;
* ``DATA_SHAPE["synthetic"]`` as a 1-tuple instead of FL-bench's int: its FedGen generator unpacks the shape
  (``torch.zeros(1, *DATA_SHAPE[name])``) and fails on an int;
* unless ``--native-rescale``: FL-bench's ``Synthetic`` loader without ``BaseDataset._rescale_data``,
  which divides the whole data set by 255 whenever its maximum exceeds 1 (meant for uint8 pixels; it
  fires on Synthetic's real-valued features, see the README of this folder).

It also wraps ``FedAvgServer.run_experiment`` to keep the server object, and afterwards writes
``test_results`` (FL-bench's ``test_client_models``: every client's test split, with the model the
client would use, predictions pooled over clients, i.e. sample-weighted accuracy) to ``--out``.
Torch is limited to one thread.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np
from digest import digest  # this folder's digest.py (the script's folder is on sys.path)


def register(native_rescale: bool) -> None:
    import data.utils.datasets as ds
    import src.utils.constants as C
    import src.utils.models as M
    import torch
    from torch import nn

    class PflDNN(M.DecoupledModel):
        """The package's DNN: Linear(d, hidden), ReLU, Linear(hidden, classes)."""

        def __init__(self, dataset: str, pretrained: bool = False, hidden: int = 20):
            super().__init__()
            shape = C.DATA_SHAPE[dataset]
            d = int(np.prod(shape)) if isinstance(shape, (tuple, list)) else int(shape)
            self.base = nn.Sequential(OrderedDict(flatten=nn.Flatten(), fc1=nn.Linear(d, hidden), activation1=nn.ReLU()))
            self.classifier = nn.Linear(hidden, C.NUM_CLASSES[dataset])

    M.MODELS["pfl_dnn"] = PflDNN
    # FL-bench gives Synthetic's shape as an int (its dimension); FedGen's generator builds its dummy input with
    # ``torch.zeros(1, *DATA_SHAPE[name])``, which needs a tuple (read after this: FedGen, FedFed and PflDNN only)
    if isinstance(C.DATA_SHAPE.get("synthetic"), int):
        C.DATA_SHAPE["synthetic"] = (C.DATA_SHAPE["synthetic"],)

    class PflImages(ds.BaseDataset):
        """``data.npy`` (N, 1, 28, 28) float32 in [-1, 1] and ``targets.npy``, as export.py writes them."""

        def __init__(self, root, args=None, **transforms):
            root = Path(root)
            super().__init__(data=torch.from_numpy(np.load(root / "data.npy")).float(),
                             targets=torch.from_numpy(np.load(root / "targets.npy")).long(), classes=list(range(10)),
                             **transforms)

    ds.DATASETS["pfl_images"] = PflImages
    C.INPUT_CHANNELS["pfl_images"] = 1
    C.DATA_SHAPE["pfl_images"] = (1, 28, 28)
    C.NUM_CLASSES["pfl_images"] = 10
    M.FedAvgCNN.feature_length["pfl_images"] = 1024

    if not native_rescale:
        class SyntheticAsIs(ds.Synthetic):
            def _rescale_data(self):  # keep the features as exported (FL-bench divides by 255 when max > 1)
                pass

        ds.DATASETS["synthetic"] = SyntheticAsIs


def record_client_accuracies() -> dict[int, dict[str, list[float | None]]]:
    """Wrap FL-bench's serial ``FLbenchTrainer._serial_test`` (``test_client_models``: one ``worker.test`` per
    client, whose metrics it pools) to keep every client's own test accuracy, before and after fine-tuning, by
    the epoch ``test_results`` files them under (``current_epoch + 1``): the returned dict, filled as it runs."""
    from src.utils.trainer import FLbenchTrainer

    per_client: dict[int, dict[str, list[float | None]]] = {}
    original = FLbenchTrainer._serial_test

    def _serial_test(self, clients, results):
        worker, accs = self.worker, {"before": [], "after": []}
        inner = worker.test

        def test(package):
            metrics = inner(package)
            for stage, series in accs.items():
                split = metrics[stage]["test"]
                series.append(float(split.accuracy) / 100 if split.size else None)
            return metrics

        worker.test = test
        try:
            return original(self, clients, results)
        finally:
            del worker.test
            per_client[int(self.server.current_epoch) + 1] = accs

    FLbenchTrainer._serial_test = _serial_test
    return per_client


def verify(manifest_path: Path) -> dict:
    import data.utils.datasets as ds

    m = json.loads(manifest_path.read_text())
    name = m["flbench_dataset"]
    root = Path("data") / name
    import pickle

    partition = pickle.load(open(root / "partition.pkl", "rb"))
    dataset = ds.DATASETS[name](root=root, args=None)  # no transforms: FL-bench has no mean/std for these names
    dataset.eval()
    ok = []
    for i, want in enumerate(m["sha256"]):
        parts = []
        for split in ("train", "test"):
            idx = partition["data_indices"][i][split]
            items = [dataset[j] for j in idx]
            parts += [np.stack([x.numpy() for x, _ in items]), np.array([int(y) for _, y in items])]
        ok.append(digest(*parts) == want)
    return {"library": "flbench", "setting": m["setting"], "dataset": name, "clients": len(ok), "identical": sum(ok)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--root", type=Path, required=True, help="the extracted FL-bench tree")
    p.add_argument("--out", type=Path, help="JSON file for the collected accuracies")
    p.add_argument("--native-rescale", action="store_true", help="keep FL-bench's division of Synthetic by 255")
    p.add_argument("--verify", type=Path, help="an export manifest: check the data only")
    p.add_argument("overrides", nargs=argparse.REMAINDER)
    a = p.parse_args()
    overrides = [x for x in a.overrides if x != "--"]

    root = a.root.resolve()
    out = a.out.resolve() if a.out else None
    os.chdir(root)
    sys.path.insert(0, str(root))
    import torch

    torch.set_num_threads(1)
    register(a.native_rescale)
    if a.verify:
        print(json.dumps(verify(a.verify.resolve())))
        return

    from src.server.fedavg import FedAvgServer

    per_client = record_client_accuracies()
    kept = {}
    original = FedAvgServer.run_experiment

    def run_experiment(self):
        kept["server"] = self
        return original(self)

    FedAvgServer.run_experiment = run_experiment

    # as ``python main.py <overrides>``: its ``__main__`` block adds hydra.run.dir=./out/<method>/<dataset>/<time>
    sys.argv = ["main.py", *overrides]
    t0 = time.time()
    runpy.run_path(str(root / "main.py"), run_name="__main__")
    seconds = time.time() - t0

    server = kept["server"]
    run_dir = Path(server.output_dir)
    rounds, before, after, means = [], [], [], {"before": [], "after": []}
    for epoch, groups in sorted(server.test_results.items()):
        metrics = groups.get("all_clients") or groups.get("test_clients")
        if metrics is None:
            continue
        rounds.append(int(epoch))
        before.append(float(metrics["before"]["test"].accuracy) / 100)
        after.append(float(metrics["after"]["test"].accuracy) / 100 if metrics["after"]["test"].size else None)
        clients = per_client.get(int(epoch), {})
        for stage, series in means.items():
            accs = [x for x in clients.get(stage, []) if x is not None]
            series.append(float(np.mean(accs)) if accs else None)
    # with common.test.client.finetune_epoch > 0 FL-bench's figure is the one after fine-tuning
    finetuned = server.args.common.test.client.finetune_epoch > 0 and all(x is not None for x in after)
    acc = after if finetuned else before
    mean = means["after" if finetuned else "before"]
    result = {
        "library": "flbench", "overrides": overrides, "native_rescale": a.native_rescale, "seconds": round(seconds, 1),
        "rounds": rounds, "accuracy_weighted": acc, "accuracy_before_finetune": before,
        "accuracy_after_finetune": after, "figure": "after fine-tuning" if finetuned else "before fine-tuning",
        "accuracy_mean": mean,
        "final_weighted": acc[-1] if acc else None, "best_weighted": max(acc) if acc else None,
        "log": str(run_dir / "main.log"),
    }
    if mean and None not in mean:
        result |= {"final_mean": mean[-1], "best_mean": max(mean)}
    if alphas := getattr(server, "client_alphas", None):  # APFL: each client's α at the end (as run.py's package side)
        s = sorted(float(v) for v in alphas.values())
        result["alpha"] = {"clients": len(s), "mean": sum(s) / len(s), "min": s[0], "median": s[len(s) // 2], "max": s[-1]}
    if out:
        out.write_text(json.dumps(result, indent=1))
    else:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
