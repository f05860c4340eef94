"""Small image data sets written in the real on-disk formats torchvision reads."""

from __future__ import annotations

import pickle
import struct
from pathlib import Path

import numpy as np


def _idx_images(path: Path, images: np.ndarray) -> None:
    n, rows, cols = images.shape
    path.write_bytes(struct.pack(">iiii", 2051, n, rows, cols) + images.astype(np.uint8).tobytes())


def _idx_labels(path: Path, labels: np.ndarray) -> None:
    path.write_bytes(struct.pack(">ii", 2049, len(labels)) + labels.astype(np.uint8).tobytes())


def images_for(labels: np.ndarray, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Noise plus a brightness that encodes the label, so a model can learn something."""
    base = (labels.reshape(-1, *[1] * len(shape)) * 20).astype(np.int64)
    return np.clip(base + rng.integers(0, 40, size=(len(labels), *shape)), 0, 255).astype(np.uint8)


def write_fashion_mnist(root: Path, n_train: int, n_test: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    raw = root / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    out = {}
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        y = rng.integers(0, 10, n)
        x = images_for(y, (28, 28), rng)
        _idx_images(raw / f"{prefix}-images-idx3-ubyte", x)
        _idx_labels(raw / f"{prefix}-labels-idx1-ubyte", y)
        out[prefix] = (x, y)
    return out


def write_emnist(root: Path, split: str, n_train: int, n_test: int, classes: int, seed: int = 0) -> dict[str, np.ndarray]:
    """EMNIST's files hold every image transposed; the returned arrays are upright."""
    rng = np.random.default_rng(seed)
    raw = root / "EMNIST" / "raw"
    raw.mkdir(parents=True)
    out = {}
    for part, n in (("train", n_train), ("test", n_test)):
        y = rng.integers(0, classes, n)
        x = images_for(y % 10, (28, 28), rng)
        x[:, 0, :5] = 255  # an asymmetric mark: top rows, left columns
        _idx_images(raw / f"emnist-{split}-{part}-images-idx3-ubyte", x.transpose(0, 2, 1))
        _idx_labels(raw / f"emnist-{split}-{part}-labels-idx1-ubyte", y)
        out[part] = (x, y)
    return out


def write_cifar10(root: Path, per_batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    out = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        y = rng.integers(0, 10, per_batch)
        x = images_for(y, (3, 32, 32), rng)
        with (folder / name).open("wb") as fh:
            pickle.dump({"data": x.reshape(per_batch, -1), "labels": y.tolist()}, fh)
        out[name] = (x, y)
    with (folder / "batches.meta").open("wb") as fh:
        pickle.dump({"label_names": [f"class{i}" for i in range(10)]}, fh)
    return out


def write_hub_folder(root: Path, image_col: str, label_col: str, labels: np.ndarray, shape: tuple[int, ...],
                     writers: list[str] | None = None, seed: int = 0) -> np.ndarray:
    """A data set in the Hugging Face layout (``data/train-*.parquet`` with an Image column), as a
    download of it from the hub would look. Returns the images (uint8, as stored)."""
    from datasets import ClassLabel, Dataset, Features, Image, Value
    from PIL import Image as PILImage

    rng = np.random.default_rng(seed)
    images = images_for(labels % 10, shape, rng)
    columns = {image_col: [PILImage.fromarray(im) for im in images], label_col: labels.tolist()}
    features = {image_col: Image(), label_col: ClassLabel(num_classes=int(labels.max()) + 1)}
    if writers is not None:
        columns["writer_id"], features["writer_id"] = writers, Value("string")
    (root / "data").mkdir(parents=True)
    Dataset.from_dict(columns, features=Features(features)).to_parquet(str(root / "data" / "train-00000-of-00001.parquet"))
    return images


def write_gtsrb(root: Path, per_class: int, test: int, classes: int = 43, seed: int = 0,
                training: str = "GTSRB/Final_Training/Images") -> dict[str, np.ndarray]:
    """GTSRB's archives unpacked into ``root/gtsrb``: the training images in ``training``'s class folders
    (``GTSRB_Final_Training_Images.zip``'s ``GTSRB/Final_Training/Images/000cc/000tt_000nn.ppm``, or torchvision's
    ``GTSRB/Training/000cc/``), each with its semicolon-separated ``GT-000cc.csv``; ``GTSRB_Final_Test_Images.zip``'s
    ``GTSRB/Final_Test/Images/nnnnn.ppm`` with its unlabelled ``GT-final_test.test.csv``, and
    ``GTSRB_Final_Test_GT.zip``'s ``GT-final_test.csv``. Images of varied sizes, each one colour (its label encoded
    in red) so that a resize keeps it; returns the labels of both parts."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    base = root / "gtsrb" / "GTSRB"
    header = "Filename;Width;Height;Roi.X1;Roi.Y1;Roi.X2;Roi.Y2"

    def image(path: Path, label: int) -> str:
        w, h = (int(v) for v in rng.integers(15, 60, 2))
        Image.fromarray(np.full((h, w, 3), (5 * label, 100, 200), np.uint8)).save(path)
        return f"{path.name};{w};{h};1;1;{w - 1};{h - 1}"

    train = []
    for c in range(classes):
        folder = root / "gtsrb" / training / f"{c:05d}"
        folder.mkdir(parents=True)
        rows = [f"{header};ClassId"] + [f"{image(folder / f'00000_{n:05d}.ppm', c)};{c}" for n in range(per_class)]
        (folder / f"GT-{c:05d}.csv").write_text("\n".join(rows) + "\n")
        train += [c] * per_class
    images = base / "Final_Test" / "Images"
    images.mkdir(parents=True)
    test_labels = rng.integers(0, classes, test)
    rows = [image(images / f"{n:05d}.ppm", int(c)) for n, c in enumerate(test_labels)]
    (images / "GT-final_test.test.csv").write_text("\n".join([header, *rows]) + "\n")
    labelled = [f"{row};{c}" for row, c in zip(rows, test_labels)]
    (root / "gtsrb" / "GT-final_test.csv").write_text("\n".join([f"{header};ClassId", *labelled]) + "\n")
    return {"train": np.asarray(train), "test": test_labels}


def write_one_colour_images(folder: Path, names: list[str], colour: tuple[int, int, int], rng: np.random.Generator,
                            sizes: tuple[int, int] = (40, 90)) -> None:
    """Images ``names`` in ``folder`` (made), each of a random size in ``sizes`` and all of one colour."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        w, h = (int(v) for v in rng.integers(*sizes, 2))
        Image.fromarray(np.full((h, w, 3), colour, np.uint8)).save(folder / name, quality=100)


def write_country211(root: Path, countries: tuple[str, ...] = ("AD", "AE", "AF"), per_part: int = 2,
                     seed: int = 0) -> dict[str, list[int]]:
    """Country211 as OpenAI's archive unpacks: ``country211/{train,valid,test}/<ISO code>/<n>.jpg``, images of varied
    sizes, each one colour (its country's index, in sorted order, encoded in red); returns each part's labels."""
    rng = np.random.default_rng(seed)
    out: dict[str, list[int]] = {}
    for part in ("train", "valid", "test"):
        out[part] = []
        for label, code in enumerate(sorted(countries)):
            write_one_colour_images(root / "country211" / part / code, [f"{n}.jpg" for n in range(per_part)], (40 * label, 100, 200), rng)
            out[part] += [label] * per_part
    return out


def write_class_folders(folder: Path, classes: tuple[str, ...], counts: dict[str, int], red: int, blue: int = 200,
                        seed: int = 0) -> list[int]:
    """One folder per class under ``folder`` (every one made, some may stay empty), ``counts[class]`` JPEGs of varied
    sizes in each, named so that sorting keeps their order; every image one colour: its label times ``red`` in red,
    ``blue`` in blue. Returns the labels in the loader's order (class, then file name)."""
    rng = np.random.default_rng(seed)
    labels = []
    for label, name in enumerate(classes):
        write_one_colour_images(folder / name, [f"{name}_{n:03d}.jpg" for n in range(counts.get(name, 0))], (red * label, 100, blue), rng)
        labels += [label] * counts.get(name, 0)
    return labels


def write_flowers102(root: Path, labels: list[int], split: dict[str, list[int]], seed: int = 0) -> None:
    """Flowers-102 as its archives unpack: ``flowers-102/jpg/image_00001.jpg`` ... (images of varied sizes, each one
    colour: its 0-based label in red), ``imagelabels.mat`` (``labels``, 1-based, by image id) and ``setid.mat``
    (``trnid``, ``valid``, ``tstid``: 1-based image ids of each part)."""
    from PIL import Image
    from scipy.io import savemat

    rng = np.random.default_rng(seed)
    folder = root / "flowers-102" / "jpg"
    folder.mkdir(parents=True)
    for n, label in enumerate(labels, 1):
        w, h = (int(v) for v in rng.integers(40, 90, 2))
        Image.fromarray(np.full((h, w, 3), (2 * label, 100, 200), np.uint8)).save(folder / f"image_{n:05d}.jpg", quality=100)
    savemat(root / "flowers-102" / "imagelabels.mat", {"labels": np.asarray(labels) + 1})
    savemat(root / "flowers-102" / "setid.mat", {"trnid": np.asarray(split["train"]), "valid": np.asarray(split["val"]),
                                                "tstid": np.asarray(split["test"])})


def write_stanford_cars(root: Path, train: list[int], test: list[int], classes: int = 196, seed: int = 0) -> None:
    """Stanford Cars as torchvision reads it (the devkit, train and test archives unpacked under ``stanford_cars/``, the
    test labels' .mat beside them): ``devkit/cars_meta.mat`` (``class_names``), ``devkit/cars_train_annos.mat`` and
    ``cars_test_annos_withlabels.mat`` (``annotations``: bounding box, 1-based ``class``, ``fname``), JPEGs of varied
    sizes in ``cars_train/`` and ``cars_test/``, each one colour (its 0-based label in red); at least two per part."""
    from scipy.io import savemat

    rng = np.random.default_rng(seed)
    base = root / "stanford_cars"
    (base / "devkit").mkdir(parents=True)
    savemat(base / "devkit" / "cars_meta.mat", {"class_names": np.asarray([f"Make {c} 2012" for c in range(classes)], dtype=object)})
    fields = ("bbox_x1", "bbox_y1", "bbox_x2", "bbox_y2", "class", "fname")
    for labels, folder, annotations_mat in ((train, "cars_train", "devkit/cars_train_annos.mat"),
                                        (test, "cars_test", "cars_test_annos_withlabels.mat")):
        records = np.zeros((1, len(labels)), dtype=[(f, "O") for f in fields])
        names = [f"{n:05d}.jpg" for n in range(1, len(labels) + 1)]
        for n, (label, name) in enumerate(zip(labels, names)):
            write_one_colour_images(base / folder, [name], (label, 100, 200), rng)
            records[0, n] = (1, 1, 30, 20, label + 1, name)
        savemat(base / annotations_mat, {"annotations": records})


#: Omniglot's folders, as its archives name them, in the order the package reads them
OMNIGLOT_SETS = ("images_background", "images_evaluation", "images_background_small1", "images_background_small2")


def write_omniglot(root: Path, characters: dict[str, dict[str, int]]) -> list[tuple[str, int]]:
    """Omniglot as its archives unpack: ``omniglot-py/<set>/<alphabet>/<character>/<id>_<drawer>.png``, 105x105
    1-bit drawings; ``characters[set]`` maps ``alphabet/character`` to its drawings. A character's drawings have
    its running number (in sorted order across the sets written, in ``OMNIGLOT_SETS``' order) of black rows at the
    top. Returns each drawing's ``(character, label)`` in that order."""
    from PIL import Image

    out = []
    names = [(part, c) for part in OMNIGLOT_SETS for c in sorted(characters.get(part, {}))]
    for label, (part, character) in enumerate(names):
        folder = root / "omniglot-py" / part / character
        folder.mkdir(parents=True)
        for drawer in range(1, characters[part][character] + 1):
            pixels = np.ones((105, 105), bool)
            pixels[: 10 * (label + 1)] = False
            Image.fromarray(pixels).save(folder / f"{label + 1:04d}_{drawer:02d}.png")
            out.append((character, label))
    return out


def write_covidx(root: Path, parts: dict[str, list[str]], seed: int = 0) -> dict[str, list[str]]:
    """COVIDx CXR as its Kaggle archive unpacks into ``covidx/``: ``<part>.txt`` lines ``patient file class source``
    and the images in ``<part>/`` (grey PNGs and JPEGs of varied sizes; positive ones bright, negative ones dark).
    ``parts[part]`` lists each image's class. Returns each part's file names."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    base = root / "covidx"
    names: dict[str, list[str]] = {}
    for part, classes in parts.items():
        (base / part).mkdir(parents=True)
        names[part] = [f"{part}-{n}.{'png' if n % 2 else 'jpg'}" for n in range(len(classes))]
        lines = []
        for n, (name, cls) in enumerate(zip(names[part], classes)):
            w, h = (int(v) for v in rng.integers(70, 120, 2))
            Image.fromarray(np.full((h, w), 220 if cls == "positive" else 30, np.uint8), "L").save(base / part / name)
            lines.append(f"{100 + n} {name} {cls} {'bimcv' if n % 2 else 'rsna'}")
        (base / f"{part}.txt").write_text("\n".join(lines) + "\n")
    return names


def write_domainnet(root: Path, images: dict[str, dict[str, list[tuple[str, int]]]], seed: int = 0) -> None:
    """DomainNet as its domains' archives unpack into ``domainnet/`` (``<domain>/<class>/<domain>_<n>.jpg``, JPEGs of
    varied sizes) with the publisher's split lists beside them (``<domain>_{train,test}.txt``: ``path label``).
    ``images[domain][part]`` lists ``(class, label)``: each image's red is its label halved, its blue the domain's
    place in ``images`` times 40."""
    rng = np.random.default_rng(seed)
    base = root / "domainnet"
    for d, (domain, parts) in enumerate(images.items()):
        for part, rows in parts.items():
            lines = []
            for n, (cls, label) in enumerate(rows):
                name = f"{domain}_{part}_{n:03d}.jpg"
                write_one_colour_images(base / domain / cls, [name], (label // 2, 100, 40 * d), rng)
                lines.append(f"{domain}/{cls}/{name} {label}")
            (base / f"{domain}_{part}.txt").write_text("\n".join(lines) + "\n")
