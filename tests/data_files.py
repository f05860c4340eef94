"""Small data sets written in each source's real on-disk format (torchvision's layouts, the archives' own,
LEAF's JSON, the hub's parquet folders); each writer returns what it wrote, for the tests to compare."""

from __future__ import annotations

import bz2
import csv
import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
from image_files import _idx_images, _idx_labels, images_for

Part = tuple[np.ndarray, np.ndarray]


def _digit_labels(n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` digit labels in a shuffled order, every digit present once ``n >= 10``."""
    return rng.permutation(np.arange(n) % 10)


def _with_mark(x: np.ndarray) -> np.ndarray:
    """Images ``(n, ..., H, W)`` with an asymmetric mark (top row, left half white), so a swap of height and
    width or a flip shows."""
    x = x.copy()
    x[..., 0, : x.shape[-1] // 2] = 255
    return x


def write_hub_split(folder: Path, split: str, columns: dict[str, list[Any]], features: dict[str, Any]) -> None:
    """One split of a data set in the hub's layout (``data/<split>-00000-of-00001.parquet``), as a download of
    it from the hub looks."""
    from datasets import Dataset, Features

    (folder / "data").mkdir(parents=True, exist_ok=True)
    Dataset.from_dict(columns, features=Features(features)).to_parquet(str(folder / "data" / f"{split}-00000-of-00001.parquet"))


# --- images ------------------------------------------------------------------------------------------------
def write_mnist(root: Path, n_train: int, n_test: int, seed: int = 0) -> dict[str, Part]:
    """torchvision's ``MNIST/raw/{train,t10k}-*-ubyte``; each part's images ``(n, 28, 28)`` and labels."""
    rng = np.random.default_rng(seed)
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    out = {}
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        y = _digit_labels(n, rng)
        x = _with_mark(images_for(y, (28, 28), rng))
        _idx_images(raw / f"{prefix}-images-idx3-ubyte", x)
        _idx_labels(raw / f"{prefix}-labels-idx1-ubyte", y)
        out[prefix] = (x, y)
    return out


def coarse_of(fine: np.ndarray) -> np.ndarray:
    """The superclass the fixture gives a fine class (one superclass per fine class, as CIFAR-100's)."""
    return (np.asarray(fine) * 7) % 20


def write_cifar100(root: Path, n_train: int, n_test: int, seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """torchvision's ``cifar-100-python/{train,test,meta}`` pickles; each part's images ``(n, 3, 32, 32)``, fine
    and coarse labels."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    out = {}
    for part, n in (("train", n_train), ("test", n_test)):
        fine = rng.choice(100, n, replace=False)
        x = _with_mark(images_for(fine % 10, (3, 32, 32), rng))
        entry = {"filenames": [f"img_{part}_{i}.png" for i in range(n)], "batch_label": f"{part} batch 1 of 1",
                 "fine_labels": fine.tolist(), "coarse_labels": coarse_of(fine).tolist(), "data": x.reshape(n, 3072)}
        with (folder / part).open("wb") as fh:
            pickle.dump(entry, fh)
        out[part] = (x, fine, coarse_of(fine))
    with (folder / "meta").open("wb") as fh:
        pickle.dump({"fine_label_names": [f"fine{i}" for i in range(100)], "coarse_label_names": [f"coarse{i}" for i in range(20)]}, fh)
    return out


def write_svhn(root: Path, n_train: int, n_test: int, seed: int = 0) -> dict[str, Part]:
    """torchvision's ``train_32x32.mat`` and ``test_32x32.mat`` (MATLAB v5: ``X`` uint8 ``(32, 32, 3, n)``, ``y``
    ``(n, 1)`` with the digit 0 stored as 10); each part's images ``(n, 3, 32, 32)`` and digits 0-9."""
    from scipy.io import savemat

    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    out = {}
    for part, n in (("train", n_train), ("test", n_test)):
        y = _digit_labels(n, rng)
        x = _with_mark(images_for(y, (3, 32, 32), rng))
        stored = np.where(y == 0, 10, y).reshape(n, 1).astype(np.uint8)
        savemat(str(root / f"{part}_32x32.mat"), {"X": x.transpose(2, 3, 1, 0), "y": stored})
        out[part] = (x, y)
    return out


#: USPS's pixel levels in the fixture: ``k / 8 - 1`` for ``k`` in 0..16, exact in text and in float32
USPS_LEVELS = np.arange(17)


def usps_value(level: np.ndarray) -> np.ndarray:
    """The value in [-1, 1] the file holds for a pixel level."""
    return np.asarray(level) / 8 - 1


def write_usps(root: Path, n_train: int, n_test: int, seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """torchvision's ``usps.bz2`` and ``usps.t.bz2``: bz2-compressed libsvm lines ``label 1:v1 ... 256:v256`` with
    labels 1-10 and values in [-1, 1]; each part's pixel levels ``(n, 16, 16)`` (``USPS_LEVELS``) and labels 1-10
    as written."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, n in (("usps.bz2", n_train), ("usps.t.bz2", n_test)):
        labels = _digit_labels(n, rng) + 1
        levels = rng.integers(0, 17, size=(n, 16, 16))
        levels[:, 0, :8] = 16
        lines = [f"{label} " + " ".join(f"{i + 1}:{v:g}" for i, v in enumerate(usps_value(lv).reshape(-1)))
                 for label, lv in zip(labels, levels)]
        with bz2.open(root / name, "wt") as fh:
            fh.write("\n".join(lines) + "\n")
        out["train" if name == "usps.bz2" else "test"] = (levels, labels)
    return out


#: Tiny-ImageNet's fixture colours: a solid image of class k has colour ``TINY_COLOURS[k]``
TINY_COLOURS = ((220, 40, 40), (40, 200, 60), (50, 60, 210))
#: the grey level of the fixture's one greyscale image
TINY_GREY = 128


def write_tiny_imagenet(root: Path, wnids: tuple[str, ...] = ("n09999999", "n01443537", "n04067472"), per_class: int = 2,
                        val: tuple[int, ...] = (2, 0, 1, 1)) -> dict[str, Any]:
    """The archive's ``tiny-imagenet-200/``: ``wnids.txt`` (not in sorted order), ``train/<wnid>/images/*.JPEG``
    and ``<wnid>_boxes.txt``, ``val/images/val_<i>.JPEG`` labelled by ``val/val_annotations.txt`` (classes
    ``val``). Every image is solid ``TINY_COLOURS[label]``, save the last validation image: greyscale, level
    ``TINY_GREY``. Returns ``wnids``, the labels in the loader's order (train by ``wnids.txt``, then val) and
    which of them is the grey one."""
    from PIL import Image

    folder = root / "tiny-imagenet-200"
    (folder / "val" / "images").mkdir(parents=True)
    (folder / "wnids.txt").write_text("\n".join(wnids) + "\n")
    labels = []
    for k, wnid in enumerate(wnids):
        images = folder / "train" / wnid / "images"
        images.mkdir(parents=True)
        boxes = []
        for i in range(per_class):
            Image.new("RGB", (64, 64), TINY_COLOURS[k]).save(images / f"{wnid}_{i}.JPEG", "JPEG", quality=95)
            boxes.append(f"{wnid}_{i}.JPEG\t{i}\t{2 * i}\t{60 - i}\t{58 - i}")
            labels.append(k)
        (folder / "train" / wnid / f"{wnid}_boxes.txt").write_text("\n".join(boxes) + "\n")
    annotations = []
    for i, k in enumerate(val):
        image = Image.new("L", (64, 64), TINY_GREY) if i == len(val) - 1 else Image.new("RGB", (64, 64), TINY_COLOURS[k])
        image.save(folder / "val" / "images" / f"val_{i}.JPEG", "JPEG", quality=95)
        annotations.append(f"val_{i}.JPEG\t{wnids[k]}\t{i}\t{i + 1}\t{50 + i}\t{60 - i}")
        labels.append(k)
    (folder / "val" / "val_annotations.txt").write_text("\n".join(annotations) + "\n")
    return {"wnids": wnids, "labels": np.asarray(labels), "grey": len(labels) - 1}


#: CINIC-10's class folders, in CIFAR-10's label order
CINIC_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


def write_cinic10(root: Path, classes: dict[str, tuple[int, ...]] | None = None, seed: int = 0) -> Part:
    """The archive's ``CINIC-10/{train,valid,test}/<class>/*.png`` (every class folder, some empty): for each
    part two images of each class in ``classes[part]``, one named as CINIC's CIFAR-10 images and one as its
    ImageNet ones; the first image of the test part is greyscale. Returns the images ``(n, 3, 32, 32)``
    and labels in the loader's order (part, class, file name)."""
    from PIL import Image

    classes = classes or {"train": (9, 0), "valid": (3,), "test": (5, 1)}
    rng = np.random.default_rng(seed)
    xs, ys = [], []
    for part in ("train", "valid", "test"):
        for name in CINIC_CLASSES:
            (root / "CINIC-10" / part / name).mkdir(parents=True)
        for label in sorted(classes[part]):
            folder = root / "CINIC-10" / part / CINIC_CLASSES[label]
            for file in (f"cifar10-{part}-{100 + label}.png", f"n0{label}691156_{7 * label}.png"):  # sorted order
                x = _with_mark(images_for(np.array([label]), (32, 32, 3), rng)[0].transpose(2, 0, 1))
                if part == "test" and not any(p == "test" for p, _ in ys):
                    grey = x[0]
                    Image.fromarray(grey, "L").save(folder / file)
                    x = np.stack([grey] * 3)
                else:
                    Image.fromarray(np.ascontiguousarray(x.transpose(1, 2, 0)), "RGB").save(folder / file)
                xs.append(x)
                ys.append((part, label))
    return np.stack(xs), np.asarray([label for _, label in ys])


def write_mnist_m_hub(folder: Path, n_train: int, n_test: int, seed: int = 0) -> dict[str, Part]:
    """MNIST-M in the hub's layout (``Mike0307/MNIST-M``: ``image`` colour 32x32, ``label``); each split's images
    ``(n, 32, 32, 3)`` and labels."""
    from datasets import ClassLabel, Image
    from PIL import Image as PILImage

    rng = np.random.default_rng(seed)
    out = {}
    for split, n in (("train", n_train), ("test", n_test)):
        y = _digit_labels(n, rng)
        x = images_for(y, (32, 32, 3), rng)
        x[:, 0, :16] = (255, 0, 0)
        write_hub_split(folder, split, {"image": [PILImage.fromarray(im) for im in x], "label": y.tolist()},
                        {"image": Image(), "label": ClassLabel(num_classes=10)})
        out[split] = (x, y)
    return out


# --- text -------------------------------------------------------------------------------------------------
#: AG News rows (class 1-4, title, description) as the archive has them: quotes, commas, and the archive's
#: backslashes where the articles had line breaks
AG_NEWS_TRAIN = (
    (3, "Wall St. Bears Claw Back Into the Black (Reuters)",
     "Reuters - Short-sellers, Wall Street's dwindling\\band of ultra-cynics, are seeing green again."),
    (4, 'Scientists say "Mars" had water', 'NASA said on Monday, "the rover found it", a first.'),
    (2, "Phelps wins again", "ATHENS - Michael Phelps won his fifth gold medal."),
    (1, "Talks resume", "Negotiators met again on Tuesday."),
)
AG_NEWS_TEST = (
    (1, "Quake hits coast", "A strong earthquake struck the coast\\early on Sunday."),
    (4, "New chip unveiled", "The chip is twice as fast, the company said."),
)


def write_news_csv(root: Path, folder_name: str, train: tuple[tuple[int, str, str], ...], test: tuple[tuple[int, str, str], ...],
                   classes: tuple[str, ...]) -> Path:
    """One of Zhang et al.'s archives, ``<folder_name>/train.csv``, ``test.csv`` and ``classes.txt``: rows
    ``"class","title","text"``, every field quoted as the originals' (a quote inside doubled). Returns the folder."""
    folder = root / folder_name
    folder.mkdir(parents=True)
    for name, rows in (("train.csv", train), ("test.csv", test)):
        with (folder / name).open("w", newline="", encoding="utf-8") as fh:
            csv.writer(fh, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows([(str(c), t, d) for c, t, d in rows])
    (folder / "classes.txt").write_text("".join(f"{c}\n" for c in classes))
    return folder


def write_ag_news_csv(root: Path, train: tuple[tuple[int, str, str], ...] = AG_NEWS_TRAIN,
                      test: tuple[tuple[int, str, str], ...] = AG_NEWS_TEST) -> Path:
    """The archive's ``ag_news_csv/``."""
    return write_news_csv(root, "ag_news_csv", train, test, ("World", "Sports", "Business", "Sci/Tech"))


#: Sogou News's rows: pinyin, with the archive's escaped newlines (a backslash and an n)
SOGOU_TRAIN = (
    (1, "zu2qiu2 bi3sai4", "zhong1guo2 dui4 ying2 le5 \\n\\n bi3sai4 jie2shu4"),
    (5, "shou3ji1 xin1pin3", "xin1 shou3ji1 fa1bu4 le5"),
    (3, "dian4ying3", "\"da4pian4\" shang4ying4"),
)
SOGOU_TEST = ((2, "gu3shi4", "gu3shi4 shang4zhang3"), (4, "qi4che1", "xin1 qi4che1 shang4shi4"))


def write_ag_news_hub(folder: Path, train: list[tuple[str, int]], test: list[tuple[str, int]]) -> None:
    """AG News in the hub's layout (``fancyzhx/ag_news``: ``text``, ``label`` a ClassLabel of the 4 topics, 0-3)."""
    from datasets import ClassLabel, Value

    features = {"text": Value("string"), "label": ClassLabel(names=["World", "Sports", "Business", "Sci/Tech"])}
    for split, rows in (("train", train), ("test", test)):
        write_hub_split(folder, split, {"text": [t for t, _ in rows], "label": [c for _, c in rows]}, features)


#: LEAF's window: 80 characters, then the next one
LEAF_WINDOW = 80
_WORDS = ("To", "be,", "or", "not", "to", "be:", "that", "is", "the", "question!", "Whether", "'tis", "nobler", "in", "mind",
          "suffer", "The", "slings", "and", "arrows", "of", "outrageous", "fortune;", "Or", "take", "arms", "against", "a",
          "sea", "troubles?", "My", "lord.", "(aside)", "-", "2", "\"Kent\"", "&")


def play_text(n_chars: int, seed: int) -> str:
    """``n_chars`` characters of a role's lines, only LEAF's letters."""
    rng = np.random.default_rng(seed)
    text = ""
    while len(text) < n_chars:
        text += " ".join(rng.choice(_WORDS, 40)) + "\n"
    return text[:n_chars]


def leaf_windows(text: str) -> tuple[list[str], list[str]]:
    """LEAF's samples of one role's text: every 80-character window, one character apart (so they overlap),
    and the character after it."""
    n = len(text) - LEAF_WINDOW
    return [text[i:i + LEAF_WINDOW] for i in range(n)], [text[i + LEAF_WINDOW] for i in range(n)]


def write_leaf_shakespeare(root: Path, texts: dict[str, str]) -> dict[str, tuple[list[str], list[str]]]:
    """LEAF's ``shakespeare/data/all_data/all_data.json`` (``users``, ``hierarchies``, ``num_samples``, ``user_data``
    with ``x`` the 80-character windows and ``y`` the next characters) of each role's text; each role's windows."""
    folder = root / "shakespeare" / "data" / "all_data"
    folder.mkdir(parents=True)
    windows = {user: leaf_windows(text) for user, text in texts.items()}
    data = {"users": list(windows), "hierarchies": [user.rsplit("_", 1)[0] for user in windows],
            "num_samples": [len(y) for _, y in windows.values()],
            "user_data": {user: {"x": x, "y": y} for user, (x, y) in windows.items()}}
    (folder / "all_data.json").write_text(json.dumps(data))
    return windows


def write_shakespeare_hub(folder: Path, windows: dict[str, tuple[list[str], list[str]]]) -> None:
    """Shakespeare in the hub's layout (``flwrlabs/shakespeare``: one ``train`` split, ``character_id``, ``x``,
    ``y``), role after role."""
    from datasets import Value

    users = [u for u, (_, y) in windows.items() for _ in y]
    write_hub_split(folder, "train", {"character_id": users, "x": [s for x, _ in windows.values() for s in x],
                                      "y": [c for _, y in windows.values() for c in y]},
                    {"character_id": Value("string"), "x": Value("string"), "y": Value("string")})


# --- signals ----------------------------------------------------------------------------------------------
#: UCI HAR's nine inertial signals, in the order the package documents (body acceleration, body gyroscope,
#: total acceleration; x, y, z)
HAR_SIGNALS = ("body_acc_x", "body_acc_y", "body_acc_z", "body_gyro_x", "body_gyro_y", "body_gyro_z",
               "total_acc_x", "total_acc_y", "total_acc_z")


def har_window(signal: int, window: int) -> np.ndarray:
    """The fixture's 128 values of signal ``signal`` in window ``window``: ``100 (signal + 1) + window + t / 1000``,
    so each row names its signal (hundreds) and window (units)."""
    return 100.0 * (signal + 1) + window + np.arange(128) / 1000


def write_har(root: Path, subjects: dict[str, list[int]], seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The archive's ``UCI HAR Dataset/{train,test}/``: ``Inertial Signals/<signal>_<part>.txt`` (one row of 128
    floats per window, in the archive's number format), ``y_<part>.txt`` (activities 1-6) and
    ``subject_<part>.txt`` (``subjects[part]``, ids 1-30). Windows are numbered across the parts (train first);
    returns each part's windows ``(n, 9, 128)`` (``har_window``), activities and subjects as written."""
    rng = np.random.default_rng(seed)
    out, first = {}, 0
    for part in ("train", "test"):
        ids = np.asarray(subjects[part])
        n = len(ids)
        folder = root / "UCI HAR Dataset" / part
        (folder / "Inertial Signals").mkdir(parents=True)
        x = np.stack([[har_window(s, first + w) for s in range(len(HAR_SIGNALS))] for w in range(n)])
        for s, name in enumerate(HAR_SIGNALS):
            rows = ["  " + "  ".join(f"{v:.7e}" for v in x[w, s]) for w in range(n)]
            (folder / "Inertial Signals" / f"{name}_{part}.txt").write_text("\n".join(rows) + "\n")
        y = rng.integers(1, 7, n)
        (folder / f"y_{part}.txt").write_text("".join(f"{v}\n" for v in y))
        (folder / f"subject_{part}.txt").write_text("".join(f"{v}\n" for v in ids))
        out[part] = (x, y, ids)
        first += n
    return out


def write_leaf_shakespeare_split(root: Path, texts: dict[str, str], train_share: float = 0.8,
                                 folders: tuple[str, str] = ("train", "test")) -> dict[str, tuple[list[str], list[str]]]:
    """LEAF's split output (``preprocess.sh -t sample``): ``shakespeare/data/train/all_data_niid_0_keep_0_train_9.json``
    and ``.../test/all_data_niid_0_keep_0_test_9.json``, each role's first windows for training and its later ones
    (after the 80-character overlap) for testing; returns each role's (train, test) windows as (x, y) pairs.
    ``folders`` names the two folders under ``shakespeare/data`` (both ``all_data``: the files put together)."""
    windows = {user: leaf_windows(text) for user, text in texts.items()}
    parts: dict[str, dict[str, dict[str, list[str]]]] = {"train": {}, "test": {}}
    for user, (x, y) in windows.items():
        cut = int(train_share * len(y))
        parts["train"][user] = {"x": x[:cut], "y": y[:cut]}
        parts["test"][user] = {"x": x[cut + LEAF_WINDOW - 1:], "y": y[cut + LEAF_WINDOW - 1:]}
    for (kind, data), folder_name in zip(parts.items(), folders):
        folder = root / "shakespeare" / "data" / folder_name
        folder.mkdir(parents=True, exist_ok=True)
        users = list(data)
        (folder / f"all_data_niid_0_keep_0_{kind}_9.json").write_text(json.dumps({
            "users": users, "hierarchies": [u.rsplit("_", 1)[0] for u in users],
            "num_samples": [len(data[u]["y"]) for u in users], "user_data": data}))
    return {user: ((parts["train"][user]["x"], parts["train"][user]["y"]), (parts["test"][user]["x"], parts["test"][user]["y"]))
            for user in windows}


# --- MedMNIST ---------------------------------------------------------------------------------------------
def write_medmnist(root: Path, subset: str, sizes: tuple[int, int, int] = (12, 4, 4), classes: int = 11,
                   seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``<subset>.npz`` as MedMNIST ships it (``np.savez_compressed``: ``train_images`` uint8 (n, 28, 28),
    ``train_labels`` uint8 (n, 1), and the same for ``val`` and ``test``); returns each part's (images, labels)."""
    rng = np.random.default_rng(seed)
    parts = {}
    for part, n in zip(("train", "val", "test"), sizes):
        labels = rng.integers(0, classes, (n, 1)).astype(np.uint8)
        parts[part] = (rng.integers(0, 256, (n, 28, 28)).astype(np.uint8), labels)
    root.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(root / f"{subset}.npz", **{f"{p}_{k}": a for p, (images, labels) in parts.items()
                                                    for k, a in (("images", images), ("labels", labels))})
    return parts


def write_amazon_review(root: Path, per_domain: tuple[int, ...] = (3, 2, 2, 3), features: int = 5003, seed: int = 0) -> dict[str, Any]:
    """PFLlib's ``AmazonReview/amazon.npz``: a sparse feature-by-review count matrix (``xx_data``, ``xx_row``: feature,
    ``xx_col``: review, ``xx_shape``), labels -1/+1 ``yy`` ``(n, 1)`` and the domains' ``offset`` ``(5, 1)``. A few
    counts fall on features past the 5,000 kept. Returns the dense reviews ``(n, features)`` and the labels."""
    rng = np.random.default_rng(seed)
    n = sum(per_domain)
    dense = np.zeros((n, features), np.float32)
    for r in range(n):
        dense[r, rng.choice(features, 6, replace=False)] = rng.integers(1, 4, 6)
    dense[0, features - 1] = 2
    feature, review = np.nonzero(dense.T)
    yy = rng.choice([-1, 1], size=(n, 1))
    (root / "AmazonReview").mkdir(parents=True)
    np.savez(root / "AmazonReview" / "amazon.npz", xx_data=dense.T[feature, review], xx_row=feature, xx_col=review,
             xx_shape=np.asarray([features, n]), yy=yy, offset=np.concatenate([[0], np.cumsum(per_domain)]).reshape(-1, 1))
    return {"x": dense, "y": yy.reshape(-1)}
