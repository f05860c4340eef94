"""Write this package's own per-client data into PFLlib's and FL-bench's data set formats.

    python benchmarks/reference/export.py --setting synthetic   # or: images, or both (default)

The clients' train/test splits come from ``flower_pfl.experiment.build.load_client_data`` with the
setting's ``ExperimentConfig`` (``settings.py``), so the three libraries train and test on the same
samples, client by client, in the same order:

* PFLlib (``system/utils/data_utils.py::read_data``): ``dataset/<name>/train/<i>.npz`` and
  ``dataset/<name>/test/<i>.npz``, each ``np.savez_compressed(data={'x': ..., 'y': ...})``, plus
  ``config.json`` as ``dataset/utils/dataset_utils.py::save_file`` writes it (PFLlib's training code
  does not read it). The floats are written as this package feeds them to its model (Synthetic as
  generated; images as ``to_float``: x / 127.5 - 1, which is PFLlib's own ``Normalize([0.5], [0.5])``).
* FL-bench (``src/server/fedavg.py::get_dataset`` / ``get_clients_data_indices``): ``data/<name>/``
  with ``data.npy`` and ``targets.npy`` (every client's train then test samples, concatenated),
  ``partition.pkl`` = ``{"separation": {"train", "val", "test", "total"}, "data_indices": [{"train",
  "val", "test"}, ...]}`` with ``split = "sample"`` (every client trains and is tested, on its own
  split), and ``args.json`` (``generate_data.py``'s keys; for Synthetic also ``dimension`` and
  ``class_num``, which ``src/utils/constants.py`` reads at import).

A manifest with a SHA-256 of every client's four arrays goes to ``<scratch>/export/<setting>.json``;
the launchers' ``--verify`` mode reads the data back through each library's own loader and compares.

Setting ``images`` first generates its data set: class-conditional 1x28x28 uint8 images written in
FashionMNIST's raw idx format (``<data-dir>/FashionMNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte``),
which this package reads with ``dataset = "fmnist"``.
"""

from __future__ import annotations

import argparse
import json
import pickle
import struct
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for a plain ``python`` call

from benchmarks.reference.digest import digest
from benchmarks.reference.settings import FLBENCH_ROOT, PFLLIB_ROOT, SCRATCH, SETTINGS, run_config

# --- (b)'s images -------------------------------------------------------------------------------

def _strokes(rng: np.random.Generator, n: int) -> np.ndarray:
    """A 28x28 float image of ``n`` blurred random line segments (one class's template)."""
    yy, xx = np.mgrid[0:28, 0:28].astype(np.float64)
    img = np.zeros((28, 28))
    for _ in range(n):
        (y0, x0), (y1, x1) = rng.uniform(5, 23, size=(2, 2))
        t = np.linspace(0, 1, 40)[:, None, None]
        py, px = y0 + t * (y1 - y0), x0 + t * (x1 - x0)
        img = np.maximum(img, np.exp(-((yy - py) ** 2 + (xx - px) ** 2) / 2.0).max(0))
    return img


def make_images(n: int, seed: int = 0, classes: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """``n`` class-conditional uint8 images (n, 28, 28) and balanced int64 labels: each class is a
    template of three strokes, shifted by up to 3 pixels, with random contrast, one random distractor
    stroke and Gaussian pixel noise (hard enough that the classes are not separable by brightness)."""
    rng = np.random.default_rng(seed)
    templates = [_strokes(rng, 3) for _ in range(classes)]
    y = rng.permutation(np.arange(n) % classes).astype(np.int64)
    x = np.empty((n, 28, 28), dtype=np.uint8)
    for i, c in enumerate(y):
        dy, dx = rng.integers(-3, 4, size=2)
        img = np.roll(templates[c], (dy, dx), axis=(0, 1)) * rng.uniform(0.5, 1.0) + 0.6 * _strokes(rng, 1)
        x[i] = np.clip(255 * img + rng.normal(0, 60, (28, 28)), 0, 255).astype(np.uint8)
    return x, y


def _idx_images(path: Path, images: np.ndarray) -> None:
    n, rows, cols = images.shape
    path.write_bytes(struct.pack(">iiii", 2051, n, rows, cols) + images.astype(np.uint8).tobytes())


def _idx_labels(path: Path, labels: np.ndarray) -> None:
    path.write_bytes(struct.pack(">ii", 2049, len(labels)) + labels.astype(np.uint8).tobytes())


def write_fashion_mnist_format(root: Path, n_train: int = 4500, n_test: int = 1500, seed: int = 0) -> None:
    """FashionMNIST's four raw files under ``root/FashionMNIST/raw`` (torchvision's layout); the
    package pools train and test files before partitioning, so the file split does not matter."""
    raw = root / "FashionMNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    x, y = make_images(n_train + n_test, seed)
    for prefix, sl in (("train", slice(0, n_train)), ("t10k", slice(n_train, None))):
        _idx_images(raw / f"{prefix}-images-idx3-ubyte", x[sl])
        _idx_labels(raw / f"{prefix}-labels-idx1-ubyte", y[sl])


# --- export -----------------------------------------------------------------------------------

def client_arrays(setting: str) -> list[dict[str, np.ndarray]]:
    """Every client's ``x_train``, ``y_train``, ``x_test``, ``y_test`` as this package builds them."""
    from flower_pfl.experiment.build import load_client_data
    from flower_pfl.experiment.config import ExperimentConfig

    cfg = ExperimentConfig.from_mapping(run_config(setting))
    n = SETTINGS[setting]["num_nodes"]
    out = []
    for pid in range(n):
        c = load_client_data(cfg, pid, n)
        out.append({k: np.ascontiguousarray(getattr(c, k).numpy()) for k in ("x_train", "y_train", "x_test", "y_test")})
    return out


def client_digest(arrays: dict[str, np.ndarray]) -> str:
    """``digest`` of a client's arrays by name."""
    return digest(*(arrays[k] for k in ("x_train", "y_train", "x_test", "y_test")))


def write_pfllib(clients: list[dict[str, np.ndarray]], folder: Path) -> None:
    for split in ("train", "test"):
        (folder / split).mkdir(parents=True, exist_ok=True)
    for i, c in enumerate(clients):
        for split in ("train", "test"):
            with open(folder / split / f"{i}.npz", "wb") as f:
                np.savez_compressed(f, data={"x": c[f"x_{split}"], "y": c[f"y_{split}"]})
    num_classes = int(max(c["y_train"].max() for c in clients)) + 1
    stats = [[[int(l), int(k)] for l, k in zip(*np.unique(np.concatenate([c["y_train"], c["y_test"]]), return_counts=True))]
             for c in clients]
    config = {"num_clients": len(clients), "num_classes": num_classes, "non_iid": True, "balance": False,
              "partition": "flower-pfl", "Size of samples for labels in clients": stats, "alpha": None, "batch_size": None}
    (folder / "config.json").write_text(json.dumps(config))


def write_flbench(clients: list[dict[str, np.ndarray]], folder: Path, name: str, setting: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    xs, ys, indices, pos = [], [], [], 0
    for c in clients:
        n_train, n_test = len(c["y_train"]), len(c["y_test"])
        xs += [c["x_train"], c["x_test"]]
        ys += [c["y_train"], c["y_test"]]
        indices.append({"train": np.arange(pos, pos + n_train, dtype=np.int64), "val": np.array([], dtype=np.int64),
                        "test": np.arange(pos + n_train, pos + n_train + n_test, dtype=np.int64)})
        pos += n_train + n_test
    np.save(folder / "data.npy", np.concatenate(xs).astype(np.float32))
    np.save(folder / "targets.npy", np.concatenate(ys).astype(np.int64))
    ids = list(range(len(clients)))
    partition = {"separation": {"train": ids, "val": ids, "test": ids, "total": len(clients)}, "data_indices": indices}
    with open(folder / "partition.pkl", "wb") as f:
        pickle.dump(partition, f)
    rc = run_config(setting)
    args = {"client_num": len(clients), "test_ratio": 1 - rc["train-fraction"], "val_ratio": 0.0, "seed": rc["seed"],
            "split": "sample", "IID_ratio": 0.0, "monitor_window_name_suffix": f"{name}-{len(clients)}clients-flower-pfl"}
    if name == "synthetic":  # read by FL-bench's src/utils/constants.py (DATA_SHAPE, NUM_CLASSES)
        args |= {"beta": rc["synthetic-alpha"], "gamma": rc["synthetic-beta"], "dimension": int(clients[0]["x_train"].shape[1]),
                 "class_num": 10}
    (folder / "args.json").write_text(json.dumps(args, indent=4))


def export(setting: str, pfllib_root: Path = PFLLIB_ROOT, flbench_root: Path = FLBENCH_ROOT) -> dict:
    spec = SETTINGS[setting]
    if spec["run_config"]["dataset"] == "fmnist" and not (Path(spec["run_config"]["data-dir"]) / "FashionMNIST" / "raw").is_dir():
        write_fashion_mnist_format(Path(spec["run_config"]["data-dir"]))
    clients = client_arrays(setting)
    write_pfllib(clients, pfllib_root / "dataset" / spec["pfllib"]["dataset"])
    write_flbench(clients, flbench_root / "data" / spec["flbench"]["dataset"], spec["flbench"]["dataset"], setting)
    manifest = {
        "setting": setting, "run_config": run_config(setting), "num_clients": len(clients),
        "train_sizes": [len(c["y_train"]) for c in clients], "test_sizes": [len(c["y_test"]) for c in clients],
        "sha256": [client_digest(c) for c in clients],
        "pfllib_dataset": spec["pfllib"]["dataset"], "flbench_dataset": spec["flbench"]["dataset"],
    }
    out = SCRATCH / "export" / f"{setting}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(manifest, indent=1))
    return manifest


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--setting", choices=[*SETTINGS, "all"], default="all")
    p.add_argument("--pfllib-root", type=Path, default=PFLLIB_ROOT)
    p.add_argument("--flbench-root", type=Path, default=FLBENCH_ROOT)
    a = p.parse_args()
    for s in SETTINGS if a.setting == "all" else [a.setting]:
        m = export(s, a.pfllib_root, a.flbench_root)
        print(f"{s}: {m['num_clients']} clients, train sizes {min(m['train_sizes'])}..{max(m['train_sizes'])}, "
              f"test sizes {min(m['test_sizes'])}..{max(m['test_sizes'])} -> PFLlib dataset/{m['pfllib_dataset']}, "
              f"FL-bench data/{m['flbench_dataset']}")


if __name__ == "__main__":
    main()
