"""LEAF's CelebA and Sentiment140 files as its preprocessing writes them (TalwalkarLab/leaf, ``data/celeba`` and
``data/sent140``): ``<name>/data/all_data/all_data.json`` and the split output ``train/`` and ``test/``
(``preprocess.sh ... -t sample``), and CelebA's JPEG images in ``celeba/data/raw/img_align_celeba/``. Each
writer returns what it wrote, for the tests to compare."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np

#: CelebA's aligned images: 178 wide, 218 high
CELEBA_SIZE = (178, 218)
IMAGES = Path("celeba/data/raw/img_align_celeba")
#: the file name the split gives (``--sf 0.05 -k 5 -t sample``: sampled, users kept, 90% for training)
SPLIT_NAME = "all_data_niid_05_keep_5_{}_9.json"


def leaf_json(users: dict[str, tuple[list[Any], list[Any]]]) -> dict[str, Any]:
    """LEAF's JSON object: ``users``, ``num_samples`` and ``user_data`` with each user's ``x`` and ``y``."""
    return {"users": list(users), "num_samples": [len(y) for _, y in users.values()],
            "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()}}


def write_leaf(root: Path, name: str, users: dict[str, tuple[list[Any], list[Any]]]) -> None:
    """``<name>/data/all_data/all_data.json``, as LEAF's ``metadata_to_json.py``/``data_to_json.py`` write it."""
    folder = root / name / "data" / "all_data"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "all_data.json").write_text(json.dumps(leaf_json(users)))


def leaf_split(users: dict[str, tuple[list[Any], list[Any]]], seed: int = 0,
               frac: float = 0.9) -> dict[str, tuple[tuple[list[Any], list[Any]], tuple[list[Any], list[Any]]]]:
    """LEAF's ``split_data.py --by_sample`` of each user: ``max(1, int(frac n))`` samples drawn for training (one
    of two), the rest for testing, both in the user's order; users of one sample are left out."""
    rng, out = random.Random(seed), {}
    for user, (x, y) in users.items():
        n = len(y)
        if n < 2:
            continue
        train = set(rng.sample(range(n), 1 if n == 2 else max(1, int(frac * n))))
        parts = [j for j in range(n) if j in train], [j for j in range(n) if j not in train]
        out[user] = tuple(([x[j] for j in part], [y[j] for j in part]) for part in parts)
    return out


def write_leaf_split(root: Path, name: str, users: dict[str, tuple[list[Any], list[Any]]], seed: int = 0,
                     folders: tuple[str, str] = ("train", "test")) -> dict[str, tuple[tuple[list[Any], list[Any]], tuple[list[Any], list[Any]]]]:
    """LEAF's split output ``<name>/data/train/all_data_..._train_9.json`` and ``.../test/..._test_9.json``
    (``folders``: both ``all_data``, the files put together); returns each user's (train, test) as (x, y) pairs."""
    split = leaf_split(users, seed)
    for part, folder_name in enumerate(folders):
        folder = root / name / "data" / folder_name
        folder.mkdir(parents=True, exist_ok=True)
        kind = ("train", "test")[part]
        (folder / SPLIT_NAME.format(kind)).write_text(json.dumps(leaf_json({u: s[part] for u, s in split.items()})))
    return split


# --- CelebA ---------------------------------------------------------------------------------------------------
def celeba_colour(label: int, image: int, celebrity: int) -> tuple[int, int, int]:
    """The fixture's face colour: red says Smiling (200) or not (40), green the image (8 apart), blue the celebrity."""
    return 200 if label else 40, 4 + 8 * image, 30 + 40 * celebrity


def write_celeba(root: Path, sizes: dict[str, int], seed: int = 0) -> dict[str, tuple[list[str], list[float]]]:
    """CelebA's ``img_align_celeba/<number>.jpg`` (178x218 JPEG, numbered from 000001 in celebrity order): a face
    of ``celeba_colour`` under a black band of 40 rows; returns each celebrity's image names and Smiling labels
    as LEAF's ``metadata_to_json.py`` writes them (``(attribute + 1) / 2``: floats)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    (root / IMAGES).mkdir(parents=True, exist_ok=True)
    users: dict[str, tuple[list[str], list[float]]] = {}
    image = 0
    for c, (celebrity, n) in enumerate(sizes.items()):
        names, labels = [], []
        for _ in range(n):
            label = int(rng.integers(0, 2))
            pixels = np.zeros((CELEBA_SIZE[1], CELEBA_SIZE[0], 3), np.uint8)
            pixels[40:] = celeba_colour(label, image, c)
            name = f"{image + 1:06d}.jpg"
            Image.fromarray(pixels).save(root / IMAGES / name, quality=95)
            names.append(name)
            labels.append((int(2 * label - 1) + 1) / 2)
            image += 1
        users[celebrity] = (names, labels)
    return users


# --- Sentiment140 ---------------------------------------------------------------------------------------------
def sent140_row(tweet: int, user: str, text: str, part: str = "training") -> list[str]:
    """LEAF's ``x`` of one tweet: Sentiment140's CSV row after its polarity (id, date, query, user, text) and the
    file it came from, as ``combine_data.py`` appends it."""
    return [str(1467810369 + tweet), "Mon Apr 06 22:19:45 PDT 2009", "NO_QUERY", user, text, part]


def sent140_users(texts: dict[str, list[tuple[str, int]]]) -> dict[str, tuple[list[list[str]], list[int]]]:
    """Each user's tweets (text, polarity 0 or 1) as LEAF's ``x`` rows and ``y``, users in sorted order as
    LEAF's ``data_to_json.py`` sorts them."""
    out, tweet = {}, 0
    for user in sorted(texts):
        rows = []
        for text, _ in texts[user]:
            rows.append(sent140_row(tweet, user, text))
            tweet += 1
        out[user] = (rows, [label for _, label in texts[user]])
    return out
