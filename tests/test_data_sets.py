"""Every data set read from small files in its real format (data_files.py), through the package's loaders and
``load_client_data``: shapes, labels, pixel values, natural partitions and splits, and the text encodings."""

import os
import re

import data_files as files
import numpy as np
import pytest
import torch

from flower_pfl.experiment import clients
from flower_pfl.experiment.clients import load_client_data
from flower_pfl.experiment.config import ConfigError, ExperimentConfig
from flower_pfl.experiment.data.images import to_float
from flower_pfl.experiment.data.text import LEAF_LETTERS, UNKNOWN_LETTER
from flower_pfl.experiment.datasets import registry
from flower_pfl.experiment.datasets.base import Where


@pytest.fixture(autouse=True)
def no_md5(monkeypatch):
    """Fixture files cannot match the real archives' md5 sums; everything else is torchvision's own code."""
    import torchvision.datasets.cifar as cifar
    import torchvision.datasets.svhn as svhn

    for module in (cifar, svhn):
        monkeypatch.setattr(module, "check_integrity", lambda path, md5=None: os.path.isfile(path))


def pool_of(name, root, **options):
    """Data set ``name``'s samples from its files under ``root``."""
    return registry.instance(name, options).load_files(root, download=False)


def letters(ids):
    """LEAF letter ids back to text."""
    return "".join(LEAF_LETTERS[i] for i in ids)


def as_letter_ids(texts):
    return np.asarray([[LEAF_LETTERS.index(c) for c in t] for t in texts], dtype=np.int64)


# --- the files, written once per test process ---------------------------------------------------------------
@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """MNIST, SVHN and USPS files and MNIST-M's hub folder (at <data-dir>/<hub id>) under one data-dir."""
    root = tmp_path_factory.mktemp("digits")
    return {"root": root, "mnist": files.write_mnist(root, 6, 4), "svhn": files.write_svhn(root, 10, 6, seed=1),
            "usps": files.write_usps(root, 10, 6, seed=2), "mnist-m": files.write_mnist_m_hub(root / "Mike0307" / "MNIST-M", 6, 4, seed=3)}


@pytest.fixture(scope="module")
def cifar100(tmp_path_factory):
    root = tmp_path_factory.mktemp("cifar100")
    return root, files.write_cifar100(root, 6, 4)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return root, files.write_tiny_imagenet(root)


@pytest.fixture(scope="module")
def cinic(tmp_path_factory):
    root = tmp_path_factory.mktemp("cinic")
    return root, files.write_cinic10(root)


@pytest.fixture(scope="module")
def ag_news(tmp_path_factory):
    root = tmp_path_factory.mktemp("ag_news")
    files.write_ag_news_csv(root)
    files.write_ag_news_hub(root / "hub", [("Stocks rise again.", 2), ("A goal, then two.", 1), ("New phone", 3)], [("Rain in Paris", 0)])
    return root


#: the roles of the Shakespeare fixture and their windows: FOOL has too few for a temporal split (81) and one
#: target that is not a LEAF letter; in sorted order the clients are HELENA, then KENT
HELENA, FOOL, KENT = "ALLS_WELL_THAT_ENDS_WELL_HELENA", "THE_TRAGEDY_OF_KING_LEAR_FOOL", "THE_TRAGEDY_OF_KING_LEAR_KENT"
SIZES = {KENT: 100, HELENA: 120, FOOL: 30}


@pytest.fixture(scope="module")
def shakespeare(tmp_path_factory):
    root = tmp_path_factory.mktemp("shakespeare")
    texts = {user: files.play_text(n + files.LEAF_WINDOW, seed=i) for i, (user, n) in enumerate(SIZES.items())}
    texts[FOOL] = texts[FOOL][:85] + "\u00e9" + texts[FOOL][86:]  # window 5's target; windows 6-29 hold it in x
    windows = files.write_leaf_shakespeare(root, texts)
    files.write_shakespeare_hub(root / "hub", windows)
    return root, texts, windows


#: UCI HAR's subjects: the archive splits them between its parts
HAR_SUBJECTS = {"train": [1, 1, 1, 3, 3, 3, 3], "test": [2, 2, 2]}


@pytest.fixture(scope="module")
def medmnist(tmp_path_factory):
    root = tmp_path_factory.mktemp("medmnist")
    return root, files.write_medmnist(root, "organamnist")


@pytest.fixture(scope="module")
def har(tmp_path_factory):
    root = tmp_path_factory.mktemp("har")
    return root, files.write_har(root, HAR_SUBJECTS)


# --- each data set's samples from its files -----------------------------------------------------------------------------
def test_mnist_idx_files(digits):
    pool = pool_of("mnist", digits["root"])
    (x_train, y_train), (x_test, y_test) = digits["mnist"]["train"], digits["mnist"]["t10k"]
    assert pool.x.shape == (10, 1, 28, 28) and pool.x.dtype == np.uint8 and pool.y.dtype == np.int64
    assert np.array_equal(pool.x[:, 0], np.concatenate([x_train, x_test])) and np.array_equal(pool.y, np.concatenate([y_train, y_test]))


@pytest.mark.parametrize("labels", ["fine", "coarse"])
def test_cifar100_fine_or_coarse_labels(cifar100, labels):
    root, written = cifar100
    pool = pool_of("cifar100", root, **{"cifar100-labels": labels})
    assert pool.x.shape == (10, 3, 32, 32) and np.array_equal(pool.x, np.concatenate([written["train"][0], written["test"][0]]))
    column = 1 if labels == "fine" else 2
    assert np.array_equal(pool.y, np.concatenate([written["train"][column], written["test"][column]]))
    assert pool.y.max() < registry.instance("cifar100", {"cifar100-labels": labels}).info().num_classes


def test_cifar100_coarse_labels_reach_the_clients(cifar100):
    root, written = cifar100
    cfg = ExperimentConfig(dataset="cifar100", partition="iid", data_dir=str(root), options={"cifar100-labels": "coarse"})
    both = [load_client_data(cfg, pid, 2) for pid in range(2)]
    got = np.concatenate([np.concatenate([c.y_train.numpy(), c.y_test.numpy()]) for c in both])
    assert sorted(got) == sorted(files.coarse_of(np.concatenate([written["train"][1], written["test"][1]])))


def test_svhn_mat_files(digits):
    pool = pool_of("svhn", digits["root"])
    (x_train, y_train), (x_test, y_test) = digits["svhn"]["train"], digits["svhn"]["test"]
    assert pool.x.shape == (16, 3, 32, 32)
    assert np.array_equal(pool.x, np.concatenate([x_train, x_test]))  # (32, 32, 3, n) to (n, 3, 32, 32): the mark stays top left
    assert np.array_equal(pool.y, np.concatenate([y_train, y_test])) and (pool.y == 0).sum() == 2  # stored as 10
    assert pool.y.max() == 9


def test_usps_libsvm_lines(digits):
    pool = pool_of("usps", digits["root"])
    (lv_train, y_train), (lv_test, y_test) = digits["usps"]["train"], digits["usps"]["test"]
    assert pool.x.shape == (16, 1, 16, 16) and pool.x.dtype == np.uint8
    # value v = k/8 - 1 is pixel floor((v + 1) / 2 * 255) = floor(255 k / 16): -1 -> 0, 0 -> 127, 1 -> 255
    assert np.array_equal(pool.x[:, 0], (255 * np.concatenate([lv_train, lv_test])) // 16)
    assert (pool.x[:, 0, 0, :8] == 255).all()
    assert np.array_equal(pool.y, np.concatenate([y_train, y_test]) - 1) and set(pool.y) == set(range(10))


def test_tiny_imagenet_jpeg_folders(tiny):
    root, written = tiny
    pool = pool_of("tiny-imagenet", root)
    # train by wnids.txt's order (not sorted: n09... is class 0), then val as val_annotations.txt says
    assert list(pool.y) == [0, 0, 1, 1, 2, 2, 2, 0, 1, 1] == list(written["labels"])
    assert pool.x.shape == (10, 3, 64, 64) and pool.x.dtype == np.uint8
    for i, label in enumerate(pool.y):
        colour = (files.TINY_GREY,) * 3 if i == written["grey"] else files.TINY_COLOURS[label]
        assert np.abs(pool.x[i].reshape(3, -1).astype(int) - np.array(colour)[:, None]).max() <= 4  # JPEG is lossy
    grey = pool.x[written["grey"]]
    assert np.array_equal(grey[0], grey[1]) and np.array_equal(grey[1], grey[2])


def test_cinic10_png_folders(cinic):
    root, (x, y) = cinic
    pool = pool_of("cinic10", root)
    assert list(pool.y) == [0, 0, 9, 9, 3, 3, 1, 1, 5, 5] == list(y)  # train, valid, test; classes in CIFAR-10's order
    assert pool.x.shape == (10, 3, 32, 32) and np.array_equal(pool.x, x)  # PNG is lossless; the grey one in 3 channels


def test_mnist_m_hub_folder(digits):
    written = digits["mnist-m"]
    ds = registry.instance("mnist-m", {})
    for where in (Where(source="huggingface", hub_dataset=str(digits["root"] / "Mike0307" / "MNIST-M")),
                  Where(data_dir=str(digits["root"]))):  # no files of its own: <data-dir>/<hub id> with either source
        pool = ds.pool(where, 2, 0)
        assert pool.x.shape == (10, 3, 32, 32)
        assert np.array_equal(pool.x, np.concatenate([written["train"][0], written["test"][0]]).transpose(0, 3, 1, 2))
        assert np.array_equal(pool.y, np.concatenate([written["train"][1], written["test"][1]]))


def test_ag_news_archive_csv(ag_news):
    pool = pool_of("ag-news", ag_news)
    assert list(pool.y) == [2, 3, 1, 0, 0, 3]  # classes 1-4 as 0-3, train.csv then test.csv
    assert pool.x[0] == ("Wall St. Bears Claw Back Into the Black (Reuters) Reuters - Short-sellers, Wall Street's "
                         "dwindling band of ultra-cynics, are seeing green again.")
    assert pool.x[1] == 'Scientists say "Mars" had water NASA said on Monday, "the rover found it", a first.'
    assert pool.x[4] == "Quake hits coast A strong earthquake struck the coast early on Sunday."


def test_ag_news_hub_folder(ag_news):
    pool = registry.instance("ag-news", {}).pool(Where(source="huggingface", hub_dataset=str(ag_news / "hub")), 2, 0)
    assert list(pool.x) == ["Stocks rise again.", "A goal, then two.", "New phone", "Rain in Paris"] and list(pool.y) == [2, 1, 3, 0]


def test_sogou_news_archive_csv_and_hub_folder(tmp_path):
    """Classes 1-5 as 0-4, title and content as one text, the archive's escaped newlines read as spaces; the hub's
    title and content columns joined the same way."""
    files.write_news_csv(tmp_path, "sogou_news_csv", files.SOGOU_TRAIN, files.SOGOU_TEST,
                         ("sports", "finance", "entertainment", "automobile", "technology"))
    pool = pool_of("sogou-news", tmp_path)
    assert list(pool.y) == [0, 4, 2, 1, 3]
    assert pool.x[0] == "zu2qiu2 bi3sai4 zhong1guo2 dui4 ying2 le5    bi3sai4 jie2shu4"
    assert pool.x[2] == 'dian4ying3 "da4pian4" shang4ying4'
    from datasets import ClassLabel, Value

    features = {"title": Value("string"), "content": Value("string"), "label": ClassLabel(num_classes=5)}
    files.write_hub_split(tmp_path / "hub", "train", {"title": ["ti3yu4", "ke1ji4"], "content": ["bi3sai4", "shou3ji1"],
                                                      "label": [0, 4]}, features)
    hub = registry.instance("sogou-news", {}).pool(Where(source="huggingface", hub_dataset=str(tmp_path / "hub")), 2, 0)
    assert list(hub.x) == ["ti3yu4 bi3sai4", "ke1ji4 shou3ji1"] and list(hub.y) == [0, 4]


def test_a_news_archive_row_without_a_class_is_named_by_file_and_line(tmp_path):
    folder = files.write_news_csv(tmp_path, "sogou_news_csv", files.SOGOU_TRAIN, files.SOGOU_TEST, ("a", "b", "c", "d", "e"))
    (folder / "test.csv").write_text('"2","gu3shi4","ok"\n"9","too","high"\n')
    with pytest.raises(clients.MalformedFile, match=r"sogou_news_csv/test\.csv, line 2: expected a class 1-5"):
        pool_of("sogou-news", tmp_path)


def test_shakespeare_leaf_json(shakespeare):
    root, texts, windows = shakespeare
    pool = pool_of("shakespeare", root)
    assert len(pool.y) == 100 + 120 + 29  # FOOL's window 5 predicts a letter LEAF does not have: left out
    fool = np.flatnonzero(pool.groups == FOOL)
    assert list(pool.x[fool]) == windows[FOOL][0][:5] + windows[FOOL][0][6:]
    assert letters(pool.y[fool]) == "".join(windows[FOOL][1][:5] + windows[FOOL][1][6:])
    encoded = registry.instance("shakespeare", {}).encoder([])(pool.x[fool])
    assert encoded.shape == (29, 80) and encoded.dtype == torch.int64
    assert encoded[5, 79] == UNKNOWN_LETTER and letters(encoded[0].tolist()) == texts[FOOL][:80]


def test_har_signals_one_row_each(har):
    root, written = har
    pool = pool_of("har", root)
    x = np.concatenate([written["train"][0], written["test"][0]])
    assert pool.x.shape == (10, 9, 128) and pool.x.dtype == np.float32
    for s in range(9):  # row s is signal s (files.HAR_SIGNALS's order), not a time-major reshape
        assert (np.floor(pool.x[:, s] / 100) == s + 1).all()
    assert np.allclose(pool.x, x, atol=1e-3)
    assert np.array_equal(pool.y, np.concatenate([written["train"][1], written["test"][1]]) - 1)
    assert list(pool.groups) == [f"subject{s:02d}" for s in HAR_SUBJECTS["train"] + HAR_SUBJECTS["test"]]


# --- every data set through load_client_data -----------------------------------------------------------------------------
#: data set, its files' fixture, extra config, one sample's shape, input dtype
SHAPES = [
    ("mnist", "digits", {}, (1, 28, 28), "float32"),
    ("cifar100", "cifar100", {}, (3, 32, 32), "float32"),
    ("svhn", "digits", {}, (3, 32, 32), "float32"),
    ("usps", "digits", {}, (1, 16, 16), "float32"),
    ("tiny-imagenet", "tiny", {}, (3, 64, 64), "float32"),
    ("cinic10", "cinic", {}, (3, 32, 32), "float32"),
    ("digits", "digits", {}, (3, 32, 32), "float32"),
    ("mnist-m", "digits", {}, (3, 32, 32), "float32"),
    ("ag-news", "ag_news", {"model": "fasttext"}, (200,), "int64"),
    ("shakespeare", "shakespeare", {"model": "char-lstm", "partition": "natural"}, (80,), "int64"),
    ("har", "har", {"partition": "natural", "min_test_samples": 1}, (9, 128), "float32"),  # the fixture's subjects are small
    ("medmnist", "medmnist", {}, (1, 28, 28), "float32"),
]


def _root(written):
    """The data-dir of a files fixture's value (``{"root": ...}``, ``(root, written)`` or the root)."""
    return written["root"] if isinstance(written, dict) else written[0] if isinstance(written, tuple) else written


@pytest.mark.parametrize(("name", "fixture", "extra", "shape", "dtype"), SHAPES, ids=[s[0] for s in SHAPES])
def test_every_data_set_gives_clients_samples_of_its_shape(request, name, fixture, extra, shape, dtype):
    root = _root(request.getfixturevalue(fixture))
    cfg = ExperimentConfig(dataset=name, data_dir=str(root), **({"partition": "iid"} | extra))
    data = [load_client_data(cfg, pid, 2) for pid in range(2)]
    assert registry.instance(name, {}).info().input_shape == shape
    for c in data:
        assert c.num_train >= 1 and len(c.y_test) >= 1
        for x in (c.x_train, c.x_test):
            assert tuple(x.shape[1:]) == shape and str(x.dtype) == f"torch.{dtype}"
            if dtype == "float32" and len(shape) == 3:
                assert x.min() >= -1 and x.max() <= 1
        assert c.y_train.dtype == c.y_test.dtype and str(c.y_train.dtype) == "torch.int64"


def test_client_images_are_the_files_pixels_in_plus_minus_one(digits):
    cfg = ExperimentConfig(dataset="svhn", partition="iid", data_dir=str(digits["root"]))
    data = [load_client_data(cfg, pid, 2) for pid in range(2)]
    x = np.concatenate([np.concatenate([c.x_train.numpy(), c.x_test.numpy()]) for c in data])
    y = np.concatenate([np.concatenate([c.y_train.numpy(), c.y_test.numpy()]) for c in data])
    written = np.concatenate([digits["svhn"]["train"][0], digits["svhn"]["test"][0]])
    labels = np.concatenate([digits["svhn"]["train"][1], digits["svhn"]["test"][1]])
    assert len(x) == 16 and x.min() == -1.0 and x.max() == 1.0  # the mark's 255 and some 0 pixel
    order = [next(i for i, w in enumerate(written) if np.array_equal(to_float(w), s)) for s in x]
    assert sorted(order) == list(range(16)) and np.array_equal(y, labels[order])


@pytest.mark.parametrize(("partition", "domains", "num", "groups"), [
    ("natural", "mnist,svhn,usps", 3, ["mnist", "svhn", "usps"]),
    ("natural", "usps,mnist", 2, ["usps", "mnist"]),
    ("iid", "mnist,svhn,usps", 6, ["mnist", "svhn", "usps"] * 2),
    ("natural", "mnist,mnist-m", 2, ["mnist", "mnist-m"]),  # MNIST-M from its hub folder at <data-dir>/<hub id>
])
def test_digits_clients_take_the_domains_in_turn(digits, partition, domains, num, groups):
    cfg = ExperimentConfig(dataset="digits", partition=partition, data_dir=str(digits["root"]), options={"digits-domains": domains})
    data = [load_client_data(cfg, pid, num) for pid in range(num)]
    assert [c.group for c in data] == groups
    sizes = {"mnist": 10, "svhn": 16, "usps": 16, "mnist-m": 10}
    for domain in set(groups):
        mine = [c for c in data if c.group == domain]
        assert sum(c.num_train + len(c.y_test) for c in mine) == sizes[domain]
        y = sorted(np.concatenate([np.concatenate([c.y_train.numpy(), c.y_test.numpy()]) for c in mine]))
        train, test = digits[domain]["train"], digits[domain]["t10k" if domain == "mnist" else "test"]
        assert y == sorted(np.concatenate([train[1], test[1]]) - (1 if domain == "usps" else 0))
        colour = None  # grey digits; colour 32x32 ones keep their pixels (MNIST-M's stored HWC)
        if domain in ("svhn", "mnist-m"):
            colour = np.concatenate([train[0], test[0]])
            colour = colour.transpose(0, 3, 1, 2) if domain == "mnist-m" else colour
        for c in mine:
            x = np.concatenate([c.x_train.numpy(), c.x_test.numpy()])
            assert x.shape[1:] == (3, 32, 32)
            grey = np.array_equal(x[:, 0], x[:, 1]) and np.array_equal(x[:, 1], x[:, 2])
            assert grey == (colour is None)  # grey digits repeated to 3 channels
            if colour is not None:
                assert all(any(np.array_equal(to_float(w), s) for w in colour) for s in x)


def test_digits_per_domain_draws_from_each(digits):
    pool = registry.instance("digits", {"digits-per-domain": 5}).pool(Where(data_dir=str(digits["root"])), 3, 0)
    assert list(pool.domains) == ["mnist"] * 5 + ["svhn"] * 5 + ["usps"] * 5 and pool.x.shape == (15, 3, 32, 32)


# --- natural partitions and their splits -------------------------------------------------------------------------------------
@pytest.mark.parametrize("source", ["torchvision", "huggingface"])
@pytest.mark.parametrize(("fraction", "cuts"), [(0.75, {HELENA: 36, KENT: 16}), (0.25, {HELENA: 30, KENT: 16})])
def test_shakespeare_one_role_per_client_split_in_time(shakespeare, source, fraction, cuts):
    root, texts, windows = shakespeare
    hub = str(root / "hub") if source == "huggingface" else ""
    cfg = ExperimentConfig(dataset="shakespeare", partition="natural", model="char-lstm", data_dir=str(root), data_source=source,
                           hub_dataset=hub, train_fraction=fraction)
    data = [load_client_data(cfg, pid, 2) for pid in range(2)]
    assert [c.group for c in data] == [HELENA, KENT]  # sorted; FOOL has fewer than 81 windows
    for c in data:
        xs, ys = windows[c.group]
        # at most train-fraction of the windows, room for 79 windows between the parts and at least 5 test windows
        # (min-test-samples: the fraction alone would leave HELENA and KENT one test window each at 0.75)
        cut = cuts[c.group]
        assert np.array_equal(c.x_train.numpy(), as_letter_ids(xs[:cut])) and letters(c.y_train.tolist()) == "".join(ys[:cut])
        assert np.array_equal(c.x_test.numpy(), as_letter_ids(xs[cut + 79:])) and letters(c.y_test.tolist()) == "".join(ys[cut + 79:])
        assert len(c.y_test) == SIZES[c.group] - cut - 79 >= 5
        # the first test window starts with the last training window's target: no test character was seen as input
        assert letters(c.x_test[0].tolist()) == texts[c.group][cut + 79:cut + 159]
        assert letters(c.x_test[0, :1].tolist()) == letters(c.y_train[-1:].tolist())
    with pytest.raises(ValueError, match="has 2 natural clients \\(1 more have fewer than 85 samples, too few"):
        load_client_data(cfg, 0, 3)


def test_har_one_subject_per_client(har):
    root, written = har
    cfg = ExperimentConfig(dataset="har", partition="natural", data_dir=str(root), min_test_samples=1)  # small subjects
    data = [load_client_data(cfg, pid, 3) for pid in range(3)]
    assert [c.group for c in data] == ["subject01", "subject02", "subject03"]
    x = np.concatenate([written["train"][0], written["test"][0]])
    y = np.concatenate([written["train"][1], written["test"][1]]) - 1
    subject = np.concatenate([written["train"][2], written["test"][2]])
    for s, c in zip((1, 2, 3), data):
        got = np.concatenate([c.x_train.numpy(), c.x_test.numpy()])
        window = np.round(got[:, 0, 0] - 100).astype(int)  # signal 0 at t = 0 names the window
        assert sorted(window) == list(np.flatnonzero(subject == s))
        assert np.allclose(got, x[window], atol=1e-3)
        assert np.array_equal(np.concatenate([c.y_train.numpy(), c.y_test.numpy()]), y[window])


# --- a vocabulary fitted on the clients' training text ------------------------------------------------------------------------
def _vocabulary_files(root):
    """Text i: its own word ``u<i>``, then ``rise`` once and ``markets`` twice: fitted on the training text, the
    ids are [PAD] 0, [UNK] 1, markets 2, rise 3, then the training texts' own words in alphabetical order."""
    rows = [(1 + i % 4, f"U{i:02d}", "rise markets markets") for i in range(16)]
    files.write_ag_news_csv(root, tuple(rows[:12]), tuple(rows[12:]))


@pytest.mark.parametrize(("vocab", "seq_len", "own_known"), [(32000, 200, True), (32000, 3, True), (4, 200, False)])
def test_ag_news_vocabulary_is_fitted_on_training_text(tmp_path, vocab, seq_len, own_known):
    _vocabulary_files(tmp_path)
    cfg = ExperimentConfig(dataset="ag-news", partition="iid", model="fasttext", data_dir=str(tmp_path),
                           options={"text-vocab-size": vocab, "text-seq-len": seq_len})
    data = [load_client_data(cfg, pid, 2) for pid in range(2)]
    rest = ([3, 2, 2] + [0] * 196)[:seq_len - 1]  # rise markets markets, padded with 0 at the end
    assert sum(c.num_train for c in data) == 12
    own = []
    for c in data:
        for x in c.x_train.tolist():
            assert x[1:] == rest
            own.append(x[0])
        for x in c.x_test.tolist():
            assert x == [1] + rest  # its own word appears only in test text: unknown
    assert sorted(own) == (list(range(4, 16)) if own_known else [1] * 12)  # one id per training text's word

    clients.client_datasets.cache_clear()
    again = [load_client_data(cfg, pid, 2) for pid in range(2)]
    assert again[0] is not data[0]
    for a, b in zip(again, data):
        assert a.x_train.tolist() == b.x_train.tolist() and a.x_test.tolist() == b.x_test.tolist()
        assert a.y_train.tolist() == b.y_train.tolist()


# --- missing files ----------------------------------------------------------------------------------------------------------
MISSING = [
    ("mnist", {}, "MNIST/raw/train-images-idx3-ubyte"),
    ("cifar100", {}, "cifar-100-python/train"),
    ("svhn", {}, "train_32x32.mat"),
    ("usps", {}, "usps.bz2"),
    ("tiny-imagenet", {}, "tiny-imagenet-200/wnids.txt"),
    ("cinic10", {}, "CINIC-10/train/<class>/*.png"),
    ("digits", {}, "MNIST/raw/train-images-idx3-ubyte, MNIST/raw/train-labels-idx1-ubyte"),
    ("ag-news", {"model": "fasttext"}, "ag_news_csv/train.csv"),
    ("shakespeare", {"model": "char-lstm", "partition": "natural"}, "shakespeare/data/*/*.json"),
    ("har", {"partition": "natural"}, "UCI HAR Dataset/train/Inertial Signals/body_acc_x_train.txt"),
]


@pytest.mark.parametrize(("name", "extra", "expected"), MISSING, ids=[m[0] for m in MISSING])
def test_missing_files_name_what_was_expected(tmp_path, name, extra, expected):
    cfg = ExperimentConfig(dataset=name, data_dir=str(tmp_path), **({"partition": "iid"} | extra))
    where = f"'{re.escape(name)}': no files under data-dir '{re.escape(str(tmp_path))}'[: ]"
    with pytest.raises(ConfigError, match=f"{where}.*{re.escape(expected)}"):
        load_client_data(cfg, 0, 2)


@pytest.mark.parametrize(("name", "extra"), [("ag-news", {"model": "fasttext"}), ("shakespeare", {"model": "char-lstm"}),
                                             ("mnist-m", {})])
def test_a_missing_hub_folder_is_named(tmp_path, name, extra):
    cfg = ExperimentConfig(dataset=name, partition="iid", data_source="huggingface", hub_dataset=str(tmp_path / "nowhere"), **extra)
    with pytest.raises(ConfigError, match=f"could not be read from the local folder '{re.escape(str(tmp_path / 'nowhere'))}'"):
        load_client_data(cfg, 0, 2)


@pytest.fixture
def offline(monkeypatch):
    """The hub cannot be reached: ``datasets`` fails at once instead of retrying for half a minute."""
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def test_an_unreachable_hub_id_is_not_called_a_local_folder(tmp_path, offline):
    cfg = ExperimentConfig(dataset="mnist-m", partition="iid", data_source="huggingface", data_dir=str(tmp_path))
    with pytest.raises(ConfigError) as err:
        load_client_data(cfg, 0, 2)
    assert "Mike0307/MNIST-M could not be read from hub id 'Mike0307/MNIST-M'" in str(err.value)


def test_digits_names_a_missing_mnist_m_folder(tmp_path, offline):
    cfg = ExperimentConfig(dataset="digits", partition="natural", data_dir=str(tmp_path), options={"digits-domains": "mnist-m"})
    with pytest.raises(ConfigError, match="Mike0307/MNIST-M"):
        load_client_data(cfg, 0, 1)


# --- LEAF's own train/test output ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("folders", [("train", "test"), ("all_data", "all_data")], ids=["train-test", "put-into-all_data"])
def test_leafs_train_and_test_output_keeps_leafs_split(tmp_path, folders):
    """LEAF's split files as its preprocessing writes them, in train/ and test/ or put together into all_data/
    (where name order puts ..._test_9.json first): every role's training and test windows are LEAF's, in time order."""
    sizes = {KENT: 500, HELENA: 600, FOOL: 450}  # windows: LEAF's test part starts 79 windows after its training part
    texts = {user: files.play_text(n + files.LEAF_WINDOW, seed=i) for i, (user, n) in enumerate(sizes.items())}
    split = files.write_leaf_shakespeare_split(tmp_path, texts, folders=folders)
    cfg = ExperimentConfig(dataset="shakespeare", partition="natural", model="char-lstm", data_dir=str(tmp_path))
    data = [load_client_data(cfg, pid, 3) for pid in range(3)]
    assert [c.group for c in data] == sorted(sizes)
    for c in data:
        (x_train, y_train), (x_test, y_test) = split[c.group]
        assert np.array_equal(c.x_train.numpy(), as_letter_ids(x_train)) and letters(c.y_train.tolist()) == "".join(y_train)
        assert np.array_equal(c.x_test.numpy(), as_letter_ids(x_test)) and letters(c.y_test.tolist()) == "".join(y_test)


def test_leafs_train_output_without_its_test_output_is_named(tmp_path):
    texts = {KENT: files.play_text(100 + files.LEAF_WINDOW, seed=0)}
    files.write_leaf_shakespeare_split(tmp_path, texts)
    for path in (tmp_path / "shakespeare" / "data" / "test").iterdir():
        path.unlink()
    cfg = ExperimentConfig(dataset="shakespeare", partition="natural", model="char-lstm", data_dir=str(tmp_path))
    with pytest.raises(ConfigError, match=r"files missing under data-dir .*found shakespeare/data/train/\*\.json; "
                                          r"missing shakespeare/data/test/\*\.json; 'shakespeare' has no download"):
        load_client_data(cfg, 0, 1)


# --- MedMNIST --------------------------------------------------------------------------------------------------
def test_medmnist_npz_as_shipped_pools_its_three_parts(medmnist):
    root, written = medmnist
    pool = pool_of("medmnist", root)
    assert pool.x.shape == (20, 1, 28, 28) and pool.x.dtype == np.uint8 and registry.instance("medmnist", {}).info().num_classes == 11
    assert np.array_equal(pool.x[:, 0], np.concatenate([written[p][0] for p in ("train", "val", "test")]))
    assert np.array_equal(pool.y, np.concatenate([written[p][1].reshape(-1) for p in ("train", "val", "test")]))


def test_medmnist_names_a_missing_subset_and_a_file_that_is_not_its_npz(tmp_path):
    files.write_medmnist(tmp_path, "organamnist")
    cfg = ExperimentConfig(dataset="medmnist", partition="iid", data_dir=str(tmp_path), options={"medmnist-subset": "organcmnist"})
    with pytest.raises(ConfigError, match=r"missing organcmnist\.npz; 'medmnist' has no download: its files are MedMNIST's"):
        load_client_data(cfg, 0, 2)
    np.savez(tmp_path / "organsmnist.npz", images=np.zeros((2, 28, 28), np.uint8))
    cfg = ExperimentConfig(dataset="medmnist", partition="iid", data_dir=str(tmp_path), options={"medmnist-subset": "organsmnist"})
    with pytest.raises(ConfigError, match=r"organsmnist\.npz: not MedMNIST's \.npz .*train_images"):
        load_client_data(cfg, 0, 2)


def test_amazon_review_sparse_counts_by_domain(tmp_path):
    """The feature-by-review matrix back to one row per review (the first 5,000 features), -1/+1 as 0/1, the domains
    from the offsets; one domain per client with the natural partition."""
    written = files.write_amazon_review(tmp_path)
    pool = pool_of("amazon-review", tmp_path)
    assert pool.x.shape == (10, 5000) and np.array_equal(pool.x, written["x"][:, :5000])
    assert pool.y.tolist() == ((written["y"] + 1) // 2).tolist()
    assert pool.domains.tolist() == ["books"] * 3 + ["dvd"] * 2 + ["electronics"] * 2 + ["kitchen"] * 3
    cfg = ExperimentConfig(dataset="amazon-review", data_dir=str(tmp_path), partition="natural", min_test_samples=1)
    kitchen = load_client_data(cfg, 3, 4)
    assert sorted(map(tuple, torch.cat([kitchen.x_train, kitchen.x_test]).tolist())) == sorted(map(tuple, written["x"][7:, :5000].tolist()))
    with np.load(tmp_path / "AmazonReview" / "amazon.npz") as npz:
        np.savez(tmp_path / "AmazonReview" / "amazon.npz", **{k: npz[k] for k in npz.files if k != "offset"})
    with pytest.raises(clients.MalformedFile, match=r"amazon\.npz: not PFLlib's amazon\.npz \(xx_data, .*offset\)"):
        pool_of("amazon-review", tmp_path)
