"""LEAF's CelebA and Sentiment140 read from small files in LEAF's format (leaf_files.py): from ``all_data/`` and from
LEAF's train/test output (its split kept), one celebrity or user per client, CelebA's pixels from its JPEG files,
Sentiment140's tweets as word ids of a vocabulary fitted on the training text, and missing or broken files named."""

import json
import re
import shutil

import leaf_files as leaf
import numpy as np
import pytest
from PIL import Image

from flower_pfl.experiment.clients import load_client_data, missing_data
from flower_pfl.experiment.config import ConfigError, ExperimentConfig
from flower_pfl.experiment.data.images import to_float
from flower_pfl.experiment.datasets import registry

#: celebrities (LEAF's ids) and their images; as clients, in sorted order: 1042, 2880, 9
CELEBS = {"2880": 6, "1042": 5, "9": 7}
#: Twitter users and their tweets (text, polarity); each tweet has its own word u<k>, then "happy happy sad"
TWEETS = {user: [(f"u{k:02d} happy happy sad", (k * 7 + i) % 3 % 2) for k in range(start, start + n)]
          for i, (user, start, n) in enumerate([("robotickilldozr", 0, 5), ("alice_k", 5, 6), ("Zed99", 11, 4)])}


def pool_of(name, root, **options):
    return registry.instance(name, options).load_files(root, download=False)


def config(name, root, **extra):
    model = {"celeba": "cnn", "sent140": "lstm"}[name]
    return ExperimentConfig(dataset=name, partition="natural", model=model, data_dir=str(root), **extra)


def resized(root, name):
    """The image file as LEAF's CNN takes it, (3, 84, 84): in colour, resized to 84x84 (bilinear)."""
    with Image.open(root / leaf.IMAGES / name) as image:
        return np.asarray(image.convert("RGB").resize((84, 84), Image.Resampling.BILINEAR)).transpose(2, 0, 1)


def image_number(x):
    """Which fixture image (0, 1, ...) a client's sample (3, 84, 84), in [-1, 1], is: its face's green."""
    return int(round(((x[1, 60, 42] + 1) * 127.5 - 4) / 8))


# --- the files, written once per test process ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def celeba(tmp_path_factory):
    root = tmp_path_factory.mktemp("celeba")
    users = leaf.write_celeba(root, CELEBS)
    leaf.write_leaf(root, "celeba", users)
    return root, users


@pytest.fixture(scope="module")
def sent140(tmp_path_factory):
    root = tmp_path_factory.mktemp("sent140")
    users = leaf.sent140_users(TWEETS)
    leaf.write_leaf(root, "sent140", users)
    return root, users


# --- CelebA -------------------------------------------------------------------------------------------------------
def test_celeba_all_data_reads_each_named_image_resized(celeba):
    root, users = celeba
    pool = pool_of("celeba", root)
    names = [n for x, _ in users.values() for n in x]
    assert pool.x.shape == (18, 3, 84, 84) and pool.x.dtype == np.uint8 and pool.y.dtype == np.int64 and pool.test is None
    assert list(pool.y) == [int(v) for _, y in users.values() for v in y] and set(pool.y) == {0, 1}
    assert list(pool.groups) == [c for c, (x, _) in users.items() for _ in x]
    for i, name in enumerate(names):
        assert np.array_equal(pool.x[i], resized(root, name))  # the file's pixels, resized
        c = list(CELEBS).index(pool.groups[i])
        face = pool.x[i][:, 60, 42].astype(int)  # the face, below the black band (40 of 218 rows: 15 of 84)
        assert np.abs(face - leaf.celeba_colour(pool.y[i], i, c)).max() <= 3  # red: the label; green: this image
        assert pool.x[i][:, 5].max() <= 3  # the band: the whole image resized, not cropped


def test_celeba_one_celebrity_per_client(celeba):
    root, users = celeba
    data = [load_client_data(config("celeba", root, min_test_samples=1), pid, 3) for pid in range(3)]
    assert [c.group for c in data] == ["1042", "2880", "9"]
    first = {c: sum(len(x) for x, _ in list(users.values())[:i]) for i, c in enumerate(users)}  # image numbers
    for c in data:
        for x in (c.x_train, c.x_test):
            assert tuple(x.shape[1:]) == (3, 84, 84) and str(x.dtype) == "torch.float32" and -1 <= x.min() and x.max() <= 1
        x = np.concatenate([c.x_train.numpy(), c.x_test.numpy()])
        y = np.concatenate([c.y_train.numpy(), c.y_test.numpy()])
        images = [image_number(s) for s in x]
        names, labels = users[c.group]
        assert sorted(images) == list(range(first[c.group], first[c.group] + len(names)))  # all its images, no other's
        for s, i, label in zip(x, images, y):
            assert np.array_equal(s, to_float(resized(root, names[i - first[c.group]])))
            assert label == labels[i - first[c.group]]


@pytest.mark.parametrize("folders", [("train", "test"), ("all_data", "all_data")], ids=["train-test", "put-into-all_data"])
def test_celeba_leafs_split_output_keeps_leafs_split(tmp_path, folders):
    users = leaf.write_celeba(tmp_path, CELEBS, seed=1)
    split = leaf.write_leaf_split(tmp_path, "celeba", users, folders=folders)
    pool = pool_of("celeba", tmp_path)
    assert pool.test is not None and pool.test.sum() == sum(len(te[1]) for _, te in split.values())
    data = [load_client_data(config("celeba", tmp_path), pid, 3) for pid in range(3)]
    assert [c.group for c in data] == sorted(CELEBS)
    for c in data:
        (train_names, train_y), (test_names, test_y) = split[c.group]
        assert len(train_names) == int(0.9 * CELEBS[c.group]) and len(test_names) >= 1
        for x, y, names, labels in ((c.x_train, c.y_train, train_names, train_y), (c.x_test, c.y_test, test_names, test_y)):
            assert np.array_equal(x.numpy(), np.stack([to_float(resized(tmp_path, n)) for n in names]))
            assert y.tolist() == [int(v) for v in labels]


def test_celeba_names_a_missing_image_and_where_it_looked(tmp_path, celeba):
    shutil.copytree(celeba[0], tmp_path, dirs_exist_ok=True)
    (tmp_path / leaf.IMAGES / "000003.jpg").unlink()
    with pytest.raises(ConfigError) as err:
        load_client_data(config("celeba", tmp_path), 0, 2)
    message = str(err.value)
    assert f"files missing under data-dir '{tmp_path.resolve()}': found celeba/data/*/*.json; missing " \
           "celeba/data/raw/img_align_celeba/000003.jpg; 'celeba' has no download: its files are LEAF's" in message
    assert "img_align_celeba.zip, identity_CelebA.txt and list_attr_celeba.txt unpacked into `celeba/data/raw/`" in message
    for n in (1, 2, 4, 5, 6, 7):
        (tmp_path / leaf.IMAGES / f"{n:06d}.jpg").unlink()
    with pytest.raises(ConfigError, match=r"missing celeba/data/raw/img_align_celeba/000001\.jpg, .*/000005\.jpg, "
                                          r"and 2 more files the lists name; 'celeba' has no download"):
        load_client_data(config("celeba", tmp_path), 0, 2)


@pytest.mark.parametrize("name", ["celeba", "sent140"])
def test_missing_leaf_files_are_named(tmp_path, name):
    expected = {"celeba": "celeba/data/*/*.json, celeba/data/raw/img_align_celeba/*.jpg", "sent140": "sent140/data/*/*.json"}[name]
    assert missing_data(config(name, tmp_path)).startswith(
        f"run config 'dataset' = '{name}': no files under data-dir '{tmp_path.resolve()}': missing {expected}; '{name}' has no download")
    with pytest.raises(ConfigError, match=re.escape(f"no {name}/data/all_data/*.json (nor LEAF's {name}/data/train/ and "
                                                    f"{name}/data/test/) under {tmp_path.resolve()}")):
        load_client_data(config(name, tmp_path), 0, 2)
    users = leaf.sent140_users(TWEETS) if name == "sent140" else leaf.write_celeba(tmp_path, CELEBS)
    leaf.write_leaf_split(tmp_path, name, users)
    shutil.rmtree(tmp_path / name / "data" / "test")
    with pytest.raises(ConfigError, match=re.escape(f"found {name}/data/train/*.json; missing {name}/data/test/*.json; "
                                                    f"'{name}' has no download")):
        load_client_data(config(name, tmp_path), 0, 2)


@pytest.mark.parametrize(("name", "user_data", "why"), [
    ("celeba", None, "JSONDecodeError"),
    ("celeba", {"9": {"x": ["000001.jpg"]}}, "KeyError: 'y'"),
    ("celeba", {"9": {"x": ["000001.jpg"], "y": [2.0]}}, "LEAF's y must be class ids 0-1; found [2.0]"),
    ("sent140", {"u": {"x": [["1", "date", "NO_QUERY", "u"]], "y": [0]}}, "LEAF's x must be a tweet's fields"),
    ("sent140", {"u": {"x": [leaf.sent140_row(0, "u", "hi")], "y": ["positive"]}}, "LEAF's y must be class ids 0-1"),
], ids=["not-json", "no-y", "celeba-label", "sent140-x", "sent140-label"])
def test_a_malformed_leaf_file_is_named(tmp_path, name, user_data, why):
    if name == "celeba":
        leaf.write_celeba(tmp_path, {"9": 1})
    path = tmp_path / name / "data" / "all_data" / "all_data.json"
    path.parent.mkdir(parents=True)
    path.write_text("{" if user_data is None else json.dumps({"users": list(user_data), "user_data": user_data}))
    with pytest.raises(ConfigError, match="a file under data-dir cannot be read: ") as err:
        load_client_data(config(name, tmp_path), 0, 1)
    assert why in str(err.value) and (str(path) if user_data is None else str(path.parent.parent)) in str(err.value)


# --- Sentiment140 ------------------------------------------------------------------------------------------------
def test_sent140_all_data_reads_each_tweets_text(sent140):
    root, users = sent140
    pool = pool_of("sent140", root)
    assert [row[3] for x, _ in users.values() for row in x] == list(pool.groups)  # LEAF's x: id, date, query, user, text, part
    assert list(pool.x) == [text for user in sorted(TWEETS) for text, _ in TWEETS[user]] and pool.x.dtype == object
    assert list(pool.y) == [label for user in sorted(TWEETS) for _, label in TWEETS[user]] and pool.y.dtype == np.int64
    assert pool.test is None and registry.instance("sent140", {}).info().num_classes == 2


@pytest.mark.parametrize(("seq_len", "shape"), [(None, 200), (25, 25)])
def test_sent140_one_user_per_client(sent140, seq_len, shape):
    root, _ = sent140
    options = {} if seq_len is None else {"text-seq-len": seq_len}
    data = [load_client_data(config("sent140", root, min_test_samples=1, options=options), pid, 3) for pid in range(3)]
    assert [c.group for c in data] == sorted(TWEETS)  # "Zed99" < "alice_k" < "robotickilldozr"
    for c in data:
        assert c.num_train + len(c.y_test) == len(TWEETS[c.group]) and c.num_train >= 1 and len(c.y_test) >= 1
        for x in (c.x_train, c.x_test):
            assert tuple(x.shape[1:]) == (shape,) and str(x.dtype) == "torch.int64"
        assert sorted(np.concatenate([c.y_train.numpy(), c.y_test.numpy()])) == sorted(label for _, label in TWEETS[c.group])


@pytest.mark.parametrize("folders", [("train", "test"), ("all_data", "all_data")], ids=["train-test", "put-into-all_data"])
def test_sent140_keeps_leafs_split_and_fits_the_vocabulary_on_training_text(tmp_path, folders):
    """Fitted on the training text the ids are [PAD] 0, [UNK] 1, happy 2, sad 3, then the training tweets' own
    words in alphabetical order; a test tweet's own word is unknown."""
    split = leaf.write_leaf_split(tmp_path, "sent140", leaf.sent140_users(TWEETS), seed=3, folders=folders)
    own = sorted(x[4].split()[0] for (train, _), _ in split.values() for x in train)
    data = [load_client_data(config("sent140", tmp_path, options={"text-seq-len": 25}), pid, 3) for pid in range(3)]
    assert [c.group for c in data] == sorted(TWEETS)
    for c in data:
        (train_x, train_y), (test_x, test_y) = split[c.group]
        rest = [2, 2, 3] + [0] * 21
        assert c.x_train.tolist() == [[4 + own.index(x[4].split()[0])] + rest for x in train_x] and c.y_train.tolist() == train_y
        assert c.x_test.tolist() == [[1] + rest for _ in test_x] and c.y_test.tolist() == test_y
