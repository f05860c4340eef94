"""Images: read through torchvision from its own file layout, decoded from the hub's columns, resized,
and scaled for a model. Every loader gives uint8 ``(n, channels, height, width)`` arrays."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from flower_pfl.engine.extras import require
from flower_pfl.experiment.data.files import MalformedFile

#: ``read_images`` reads each file's header and decodes nothing (``headers_only``)
_HEADERS_ONLY: ContextVar[bool] = ContextVar("headers_only", default=False)


@contextmanager
def headers_only() -> Iterator[None]:
    """Within it, ``read_images`` opens each file and reads its header (a file that is missing or not an image is
    named as when decoding) but decodes no pixels: it gives ``(n, C, 0, 0)`` arrays. Partitioning an image data
    set needs its labels and natural clients, not its pixels (``python -m flower_pfl check``)."""
    token = _HEADERS_ONLY.set(True)
    try:
        yield
    finally:
        _HEADERS_ONLY.reset(token)


def channels_first(x: np.ndarray) -> np.ndarray:
    """uint8 images ``(n, H, W)``, ``(n, H, W, C)`` or ``(n, C, H, W)`` as ``(n, C, H, W)``."""
    x = np.asarray(x)
    if x.ndim == 3:
        x = x[:, None]
    elif x.shape[-1] in (1, 3) and x.shape[1] not in (1, 3):
        x = x.transpose(0, 3, 1, 2)
    return np.ascontiguousarray(x, dtype=np.uint8)


def torchvision_pool(class_name: str, root: str | Path, download: bool, dataset: str,
                     **kwargs: Any) -> tuple[np.ndarray, np.ndarray]:
    """Both parts (train, then test) of torchvision's data set ``class_name`` under ``root``, pooled: uint8
    ``(n, C, H, W)`` images and int64 labels (for the run config's ``dataset``, named in errors). Missing
    files raise ``FileNotFoundError``."""
    require("torchvision", why=f"dataset = {dataset!r}")
    from torchvision import datasets

    cls = getattr(datasets, class_name)
    parts = []
    for train in (True, False):
        split = {"split": "train" if train else "test"} if class_name == "SVHN" else {"train": train}
        try:
            parts.append(cls(str(root), download=download, **split, **kwargs))
        except RuntimeError as err:  # torchvision's "Dataset not found or corrupted"
            raise FileNotFoundError(f"{class_name} not found under {Path(root).resolve()} ({err})") from err
    xs = [channels_first(np.asarray(p.data)) for p in parts]
    ys = [np.asarray(p.targets if hasattr(p, "targets") else p.labels, dtype=np.int64) for p in parts]  # SVHN: labels
    return np.concatenate(xs), np.concatenate(ys)


def torchvision_resized_pool(class_name: str, root: str | Path, download: bool, dataset: str, splits: Sequence[str],
                             side: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``splits`` of torchvision's data set ``class_name`` (one of images of many sizes, read by its
    ``split`` argument) under ``root``, pooled: each image in colour resized to ``side`` x ``side`` (bilinear)
    as uint8 ``(n, 3, side, side)``, and int64 labels. Missing files raise ``FileNotFoundError``."""
    require("torchvision", why=f"dataset = {dataset!r}")
    from PIL import Image
    from torchvision import datasets

    images, labels = [], []
    for split in splits:
        try:
            part = getattr(datasets, class_name)(str(root), split=split, download=download)
        except (RuntimeError, FileNotFoundError) as err:  # no folder, or a part's index file missing
            raise FileNotFoundError(f"{class_name}'s {split} part not found under {Path(root).resolve()} ({err})") from err
        for i in range(len(part)):
            image, label = part[i]
            images.append(np.asarray(image.convert("RGB").resize((side, side), Image.Resampling.BILINEAR)))
            labels.append(label)
    x = channels_first(np.stack(images)) if images else np.zeros((0, 3, side, side), np.uint8)
    return x, np.asarray(labels, dtype=np.int64)


def read_images(paths: Sequence[str | Path], side: int | None = None, grey: bool = False) -> np.ndarray:
    """Image files as uint8 ``(n, C, H, W)``: in colour (grey ones repeated to three channels) or, with ``grey``,
    one channel; with ``side``, each resized to ``side`` x ``side`` (bilinear, as torchvision's ``Resize``) into
    one array filled in place, else all of one size. A file PIL cannot read raises ``MalformedFile`` naming it.
    Within ``headers_only``, only each file's header is read."""
    require("PIL", why="image files")
    from PIL import Image, UnidentifiedImageError

    channels, headers = 1 if grey else 3, _HEADERS_ONLY.get()

    def one(path: str | Path) -> np.ndarray:
        try:
            with Image.open(path) as image:
                if headers:
                    return np.zeros((0, 0, channels), np.uint8)
                converted = image.convert("L" if grey else "RGB")
                return np.asarray(converted if side is None else converted.resize((side, side), Image.Resampling.BILINEAR))
        except (UnidentifiedImageError, OSError) as err:
            raise MalformedFile(f"{path}: not an image file PIL can read ({err})") from err

    if headers:
        for path in paths:
            one(path)
        return np.zeros((len(paths), channels, 0, 0), np.uint8)
    if not paths:
        return np.zeros((0, channels, side or 1, side or 1), np.uint8)
    if side is None:
        return channels_first(np.stack([one(p) for p in paths]))
    out = np.empty((len(paths), channels, side, side), np.uint8)  # filled in place: no second copy of a large set
    for i, path in enumerate(paths):
        out[i] = one(path).reshape(side, side, channels).transpose(2, 0, 1)
    return out


def decode_images(images: Sequence[Any], shape: tuple[int, ...]) -> np.ndarray:
    """Images (PIL images, as the hub's columns give them, or arrays) as uint8 ``(n, C, H, W)`` of ``shape``'s
    channels (grey ones with 1, colour ones with 3)."""
    mode = "L" if shape[0] == 1 else "RGB"
    return channels_first(np.stack([np.asarray(im.convert(mode)) if hasattr(im, "convert") else np.asarray(im) for im in images]))


def resize(x: np.ndarray, side: int, channels: int) -> np.ndarray:
    """uint8 images ``(n, C, H, W)`` as ``(n, channels, side, side)``: bilinear with antialiasing, grey
    repeated to three channels."""
    t = torch.as_tensor(x).float()
    if t.shape[1] != channels:
        t = t.expand(-1, channels, -1, -1) if t.shape[1] == 1 else t.mean(1, keepdim=True)
    if t.shape[2:] != (side, side):
        t = F.interpolate(t, size=(side, side), mode="bilinear", antialias=True, align_corners=False)
    return t.round().clamp(0, 255).to(torch.uint8).contiguous().numpy()


def to_float(x: np.ndarray) -> np.ndarray:
    """uint8 pixels to float32 in [-1, 1]."""
    return (x.astype(np.float32) / 127.5) - 1.0
