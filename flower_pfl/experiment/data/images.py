"""Image data sets through torchvision, from a local folder (``download=True`` fetches them).

Each loader pools the official train and test parts; the experiment then
partitions the pool over clients and splits every client's share into its own
train and test parts, as the papers do. Pixels are scaled to [-1, 1].
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from flower_pfl.engine.extras import require

#: name -> (input shape, number of classes); EMNIST's classes depend on its split
IMAGE_SHAPES: dict[str, tuple[int, int, int]] = {
    "fmnist": (1, 28, 28), "emnist": (1, 28, 28), "cifar10": (3, 32, 32), "femnist": (1, 28, 28),
}
EMNIST_CLASSES: dict[str, int] = {"byclass": 62, "bymerge": 47, "balanced": 47, "letters": 27, "digits": 10, "mnist": 10}


def num_classes(name: str, emnist_split: str = "byclass") -> int:
    if name == "femnist":
        return 62
    return EMNIST_CLASSES[emnist_split] if name == "emnist" else 10


def expected_files(name: str, emnist_split: str = "byclass") -> list[str]:
    """The files (relative to the data folder, in torchvision's layout) that data set ``name`` is read from."""
    if name == "fmnist":
        return [f"FashionMNIST/raw/{part}-{kind}-ubyte" for part in ("train", "t10k") for kind in ("images-idx3", "labels-idx1")]
    if name == "emnist":
        return [f"EMNIST/raw/emnist-{emnist_split}-{part}-{kind}-ubyte" for part in ("train", "test")
                for kind in ("images-idx3", "labels-idx1")]
    if name == "cifar10":
        return [f"cifar-10-batches-py/{batch}" for batch in (*(f"data_batch_{i}" for i in range(1, 6)), "test_batch", "batches.meta")]
    raise ValueError(f"unknown image data set {name!r}; one of {sorted(IMAGE_SHAPES)}")


def load_image_pool(name: str, root: str | Path, download: bool = False, emnist_split: str = "byclass") -> tuple[np.ndarray, np.ndarray]:
    """All samples of data set ``name`` as ``(x, y)``: uint8 ``(N, C, H, W)`` images and int64 labels.

    ``root`` holds torchvision's layout (``FashionMNIST/raw/*-ubyte``, ``EMNIST/raw/emnist-<split>-*-ubyte``,
    ``cifar-10-batches-py/``). Missing files raise ``FileNotFoundError`` saying where they were looked for.
    """
    require("torchvision", why=f"dataset = {name!r}")
    from torchvision import datasets

    def part(train: bool):  # one torchvision data set object
        if name == "fmnist":
            return datasets.FashionMNIST(root, train=train, download=download)
        if name == "emnist":
            return datasets.EMNIST(root, split=emnist_split, train=train, download=download)
        if name == "cifar10":
            return datasets.CIFAR10(root, train=train, download=download)
        raise ValueError(f"unknown image data set {name!r}; one of {sorted(IMAGE_SHAPES)}")

    try:
        parts = [part(True), part(False)]
    except RuntimeError as err:  # torchvision's "Dataset not found or corrupted"
        raise FileNotFoundError(
            f"{name} not found under {Path(root).resolve()} ({err}). Put the files there in torchvision's layout, "
            "or set download = true on a machine with internet access."
        ) from err
    xs, ys = [], []
    for ds in parts:
        x = np.asarray(ds.data)
        if name == "cifar10":
            x = x.transpose(0, 3, 1, 2)  # HWC -> CHW
        else:
            x = x[:, None]
            if name == "emnist":
                x = x.transpose(0, 1, 3, 2)  # EMNIST's files store images transposed
        xs.append(np.ascontiguousarray(x, dtype=np.uint8))
        ys.append(np.asarray(ds.targets, dtype=np.int64))
    return np.concatenate(xs), np.concatenate(ys)


def to_float(x: np.ndarray) -> np.ndarray:
    """uint8 pixels to float32 in [-1, 1]."""
    return (x.astype(np.float32) / 127.5) - 1.0
