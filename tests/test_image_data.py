"""Image data sets through torchvision from a local folder, on files the tests write."""

import gzip
import json
import os
import re
import shutil

import image_files as files
import numpy as np
import pytest

from flower_pfl.experiment.build import load_client_data
from flower_pfl.experiment.config import ConfigError, ExperimentConfig
from flower_pfl.experiment.data.images import to_float
from flower_pfl.experiment.datasets import registry
from flower_pfl.tools import check
from server_apps.inprocess import run_in_process


def load_image_pool(name, root, **options):
    """Data set ``name``'s samples from its files under ``root``, as the experiment reads them."""
    pool = registry.instance(name, options).load_files(root, download=False)
    return pool.x, pool.y


def test_fashion_mnist_idx_files(tmp_path):
    written = files.write_fashion_mnist(tmp_path, 30, 10)
    x, y = load_image_pool("fmnist", tmp_path)
    assert x.shape == (40, 1, 28, 28) and x.dtype == np.uint8 and y.dtype == np.int64
    assert np.array_equal(x[:30, 0], written["train"][0]) and np.array_equal(y[30:], written["t10k"][1])


def test_emnist_is_returned_upright(tmp_path):
    written = files.write_emnist(tmp_path, "byclass", 20, 5, classes=62)
    x, y = load_image_pool("emnist", tmp_path, **{"emnist-split": "byclass"})
    assert x.shape == (25, 1, 28, 28)
    assert np.array_equal(x[:20, 0], written["train"][0]) and (x[:, 0, 0, :5] == 255).all()
    assert np.array_equal(y[20:], written["test"][1])


def _as_published(raw):
    """The idx files under ``raw`` gzipped, as LeCun, Zalando and EMNIST ship them, the unpacked ones removed."""
    for path in sorted(raw.glob("*-ubyte")):
        with gzip.open(f"{path}.gz", "wb") as packed:
            packed.write(path.read_bytes())
        path.unlink()


@pytest.mark.parametrize("name", ["fmnist", "emnist"])
def test_gzipped_idx_files_as_published_are_read(tmp_path, name):
    written = files.write_fashion_mnist(tmp_path, 30, 10) if name == "fmnist" else \
        files.write_emnist(tmp_path, "byclass", 30, 10, classes=62)
    raw = tmp_path / ("FashionMNIST" if name == "fmnist" else "EMNIST") / "raw"
    _as_published(raw)
    assert {p.suffix for p in raw.iterdir()} == {".gz"}
    x, y = load_image_pool(name, tmp_path)
    first = "train"
    assert x.shape == (40, 1, 28, 28) and np.array_equal(x[:30, 0], written[first][0]) and np.array_equal(y[:30], written[first][1])
    assert len(list(raw.glob("*-ubyte"))) == 4  # unpacked next to them, once, as torchvision's own download does


def test_a_missing_file_is_named_exactly_beside_those_found(tmp_path):
    files.write_fashion_mnist(tmp_path, 10, 5)
    (tmp_path / "FashionMNIST" / "raw" / "t10k-labels-idx1-ubyte").unlink()
    cfg = ExperimentConfig.from_mapping({"dataset": "fmnist", "partition": "iid", "data-dir": str(tmp_path)})
    with pytest.raises(ConfigError) as err:
        load_client_data(cfg, 0, 2)
    message = str(err.value)
    assert "files missing under data-dir" in message and "missing FashionMNIST/raw/t10k-labels-idx1-ubyte" in message
    assert "found FashionMNIST/raw/train-images-idx3-ubyte, FashionMNIST/raw/train-labels-idx1-ubyte, " \
           "FashionMNIST/raw/t10k-images-idx3-ubyte;" in message
    assert "Dataset not found" not in message and message.endswith("set 'data-dir' or 'download = true'")


def test_a_truncated_idx_file_is_named_with_what_is_wrong(tmp_path):
    files.write_fashion_mnist(tmp_path, 10, 5)
    images = tmp_path / "FashionMNIST" / "raw" / "train-images-idx3-ubyte"
    images.write_bytes(images.read_bytes()[:-100])
    cfg = ExperimentConfig.from_mapping({"dataset": "fmnist", "partition": "iid", "data-dir": str(tmp_path)})
    with pytest.raises(ConfigError, match=r"cannot be read: .*train-images-idx3-ubyte: its header says 10 x 28 x 28 bytes"
                                          r" of data \(7856 bytes in all\) but the file has 7756: truncated"):
        load_client_data(cfg, 0, 2)


@pytest.mark.parametrize(("name", "extra", "archive"), [
    ("shakespeare", {"model": "char-lstm", "partition": "natural"}, "LEAF's"),
    ("ag-news", {"model": "fasttext"}, "ag_news_csv"),
    ("har", {"partition": "natural"}, "UCI HAR Dataset"),
    ("kvasir", {}, "kvasir-dataset-v2.zip"),
    ("stanford-cars", {}, "cars_train.tgz"),
])
@pytest.mark.parametrize("download", [False, True])
def test_a_data_set_without_a_download_says_where_its_files_come_from(tmp_path, name, extra, archive, download):
    cfg = ExperimentConfig(dataset=name, data_dir=str(tmp_path), download=download, **({"partition": "iid"} | extra))
    with pytest.raises(ConfigError) as err:
        load_client_data(cfg, 0, 2)
    message = str(err.value)
    assert f"'{name}' has no download: its files are" in message and archive in message
    assert "download = true" not in message and "download failed" not in message


def test_cifar10_pickled_batches(tmp_path, monkeypatch):
    import torchvision.datasets.cifar as cifar

    # our files cannot match the real archive's md5 sums; everything else is torchvision's own code
    monkeypatch.setattr(cifar, "check_integrity", lambda path, md5=None: os.path.isfile(path))
    written = files.write_cifar10(tmp_path, per_batch=4)
    x, y = load_image_pool("cifar10", tmp_path)
    assert x.shape == (24, 3, 32, 32)
    assert np.array_equal(x[:4], written["data_batch_1"][0]) and np.array_equal(y[-4:], written["test_batch"][1])


def test_missing_files_say_where_they_were_looked_for(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        load_image_pool("fmnist", tmp_path)


def test_pixels_scaled_to_plus_minus_one():
    assert np.allclose(to_float(np.array([0, 255], np.uint8)), [-1.0, 1.0])


def test_image_data_needs_a_label_partition():
    with pytest.raises(ConfigError, match="'partition'.*dirichlet"):
        ExperimentConfig.from_mapping({"dataset": "fmnist"})


def test_fmnist_cnn_run_end_to_end(tmp_path):
    files.write_fashion_mnist(tmp_path / "data", 400, 100)
    out = run_in_process({"dataset": "fmnist", "data-dir": str(tmp_path / "data"), "partition": "pathological",
                          "model": "cnn", "method": "fedacs", "num-rounds": 2, "clients-per-round": 3,
                          "local-steps": 2, "eval-every": 1, "output-dir": str(tmp_path / "out")}, num_clients=5)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["evaluated_rounds"] == 2 and 0 <= summary["bmta"] <= 1


@pytest.mark.parametrize("training", ["GTSRB/Final_Training/Images", "GTSRB/Training"])  # the archive's, torchvision's
def test_gtsrb_as_its_archives_unpack(tmp_path, training):
    """Training images in class folders, test images named by the GT csv: both parts pooled, resized to 32x32, each
    image still its one colour (the label in its red channel)."""
    written = files.write_gtsrb(tmp_path, per_class=2, test=5, training=training)
    x, y = load_image_pool("gtsrb", tmp_path)
    assert x.shape == (2 * 43 + 5, 3, 32, 32) and x.dtype == np.uint8
    assert np.array_equal(y, np.concatenate([written["train"], written["test"]]))
    assert np.array_equal(x[:, 0, 16, 16], 5 * y) and (x[:, 1] == 100).all()


def gtsrb_stop(root, looked_for=True):
    """What a run on GTSRB's files under ``root`` stops with; for files ``looked_for`` (not read), what python -m
    flower_pfl check says too."""
    cfg = ExperimentConfig.from_mapping({"dataset": "gtsrb", "partition": "iid", "data-dir": str(root)})
    with pytest.raises(ConfigError) as err:
        load_client_data(cfg, 0, 2)
    assert check.data_and_model_problems(cfg) == ([str(err.value)] if looked_for else [])
    return str(err.value)


def test_gtsrb_files_missing_are_named_with_the_archives_and_layouts_read(tmp_path):
    """Nothing there: each file where it is looked for, with its archive, both training layouts; one layout short of
    class folders: those; both complete: the published one read."""
    message = gtsrb_stop(tmp_path / "none")
    assert message.endswith(
        "missing gtsrb/GTSRB/Final_Training/Images/<class>/*.ppm (GTSRB_Final_Training_Images.zip) or "
        "gtsrb/GTSRB/Training/<class>/*.ppm (torchvision's download, GTSRB-Training_fixed.zip), "
        "gtsrb/GTSRB/Final_Test/Images/*.ppm (GTSRB_Final_Test_Images.zip), gtsrb/GT-final_test.csv (GTSRB_Final_Test_GT.zip); "
        "set 'data-dir' or 'download = true'")
    files.write_gtsrb(tmp_path, per_class=1, test=3)
    (tmp_path / "gtsrb" / "GT-final_test.csv").unlink()
    for c in range(35, 43):
        shutil.rmtree(tmp_path / "gtsrb" / "GTSRB" / "Final_Training" / "Images" / f"{c:05d}")
    assert gtsrb_stop(tmp_path).endswith(
        "found gtsrb/GTSRB/Final_Training/Images/<class>/*.ppm, gtsrb/GTSRB/Final_Test/Images/*.ppm; missing "
        + "".join(f"gtsrb/GTSRB/Final_Training/Images/000{c}/, " for c in range(35, 40))
        + "and 3 more class folders, gtsrb/GT-final_test.csv (GTSRB_Final_Test_GT.zip); set 'data-dir' or 'download = true'")
    both = tmp_path / "both"
    written = files.write_gtsrb(both, per_class=1, test=2)
    files.write_gtsrb(tmp_path / "other", per_class=3, test=0, training="GTSRB/Training")
    shutil.copytree(tmp_path / "other" / "gtsrb" / "GTSRB" / "Training", both / "gtsrb" / "GTSRB" / "Training")
    assert load_image_pool("gtsrb", both)[1].tolist() == written["train"].tolist() + written["test"].tolist()


def test_gtsrb_test_labels_and_images_are_checked(tmp_path):
    """The unlabelled GT-final_test.test.csv in place of the ground truth, a label out of range and a listed image
    missing are each named."""
    files.write_gtsrb(tmp_path, per_class=1, test=3)
    truth, images = tmp_path / "gtsrb" / "GT-final_test.csv", tmp_path / "gtsrb" / "GTSRB" / "Final_Test" / "Images"
    labelled = truth.read_text()
    shutil.copy(images / "GT-final_test.test.csv", truth)
    assert re.search(r"GT-final_test.csv: not GTSRB's GT-final_test.csv \(GTSRB_Final_Test_GT.zip\): it has no column ClassId",
                     gtsrb_stop(tmp_path, looked_for=False))
    truth.write_text(labelled.rsplit(";", 1)[0] + ";43\n")
    assert "GT-final_test.csv: row 3: ClassId = '43', expected an integer in [0, 42]" in gtsrb_stop(tmp_path, looked_for=False)
    truth.write_text(labelled)
    (images / "00001.ppm").unlink()
    assert gtsrb_stop(tmp_path, looked_for=False).endswith("found gtsrb/GT-final_test.csv; missing gtsrb/GTSRB/Final_Test/Images/00001.ppm; "
                                         "set 'data-dir' or 'download = true'")


def test_country211_as_its_archive_unpacks(tmp_path):
    written = files.write_country211(tmp_path)
    x, y = load_image_pool("country211", tmp_path)
    assert x.shape == (18, 3, 32, 32) and np.array_equal(y, written["train"] + written["valid"] + written["test"])
    assert np.allclose(x[:, 0, 16, 16], 40 * y, atol=3) and registry.instance("country211", {}).info().num_classes == 211


def test_flowers102_as_its_archives_unpack(tmp_path, monkeypatch):
    from torchvision.datasets import flowers102

    # our .mat files cannot match the real ones' md5 sums; everything else is torchvision's own code
    monkeypatch.setattr(flowers102, "check_integrity", lambda path, md5=None: os.path.isfile(path))
    labels = [0, 5, 101, 7, 7, 3, 50, 9]
    split = {"train": [2, 1, 3], "val": [5, 4], "test": [8, 6, 7]}  # 1-based image ids, in setid.mat's order
    files.write_flowers102(tmp_path, labels, split)
    x, y = load_image_pool("flowers102", tmp_path)
    ids = split["train"] + split["val"] + split["test"]
    assert x.shape == (8, 3, 32, 32) and y.tolist() == [labels[i - 1] for i in ids]
    assert np.allclose(x[:, 0, 16, 16], 2 * y, atol=3) and registry.instance("flowers102", {}).info().num_classes == 102


def test_kvasir_as_its_archive_unpacks(tmp_path):
    """Eight class folders in sorted order (one empty), each image resized to 64x64 and still its one colour."""
    from flower_pfl.experiment.datasets.kvasir import Kvasir

    counts = {"dyed-lifted-polyps": 2, "esophagitis": 1, "polyps": 3, "ulcerative-colitis": 1}
    labels = files.write_class_folders(tmp_path / "kvasir-dataset-v2", Kvasir.class_names, counts, red=30)
    x, y = load_image_pool("kvasir", tmp_path)
    assert x.shape == (7, 3, 64, 64) and y.tolist() == labels == [0, 0, 2, 6, 6, 6, 7]
    assert np.allclose(x[:, 0, 32, 32], 30 * y, atol=3) and np.allclose(x[:, 2], 200, atol=3)
    (tmp_path / "kvasir-dataset-v2" / "normal-cecum").rmdir()
    cfg = ExperimentConfig.from_mapping({"dataset": "kvasir", "partition": "iid", "data-dir": str(tmp_path)})
    with pytest.raises(ConfigError, match=r"found kvasir-dataset-v2/<class>/\*\.jpg; missing kvasir-dataset-v2/normal-cecum/;"
                                          r" 'kvasir' has no download: its files are the archive's"):
        load_client_data(cfg, 0, 2)


def test_office_caltech10_domains_as_fedbns_archive_unpacks(tmp_path):
    """Each domain's class folders, the domains in the order asked; one domain per client with the natural partition."""
    from flower_pfl.experiment.datasets.office_caltech10 import OfficeCaltech10

    names = OfficeCaltech10.class_names
    written = {domain: files.write_class_folders(tmp_path / "office_caltech_10" / domain, names, {names[0]: 2, names[9]: n}, red=25,
                                                 blue=50 * d, seed=d)
               for d, (domain, n) in enumerate({"amazon": 3, "caltech": 2, "dslr": 1, "webcam": 2}.items())}
    pool = registry.instance("office-caltech10", {"office-caltech10-domains": "webcam,amazon"}).load_files(tmp_path, download=False)
    assert pool.x.shape == (9, 3, 64, 64) and pool.y.tolist() == written["webcam"] + written["amazon"]
    assert pool.domains.tolist() == ["webcam"] * 4 + ["amazon"] * 5
    assert np.allclose(pool.x[:, 0, 9, 9], 25 * pool.y, atol=3) and np.allclose(pool.x[:4, 2], 150, atol=3)
    cfg = ExperimentConfig(dataset="office-caltech10", data_dir=str(tmp_path), partition="natural", min_test_samples=1,
                           options={"office-caltech10-domains": "dslr,caltech"})
    data = [load_client_data(cfg, pid, 2) for pid in range(2)]
    assert [c.num_train + len(c.y_test) for c in data] == [3, 4]
    with pytest.raises(ConfigError, match=r"has 2 domains \(dslr, caltech\), fewer than the 3 clients asked for by one client per node") as run:
        load_client_data(cfg, 0, 3)
    assert check.data_and_model_problems(cfg, 3) == [str(run.value)]  # python -m flower_pfl check on 3 nodes
    with pytest.raises(ValueError, match="distinct domains among amazon, caltech, dslr, webcam"):
        registry.instance("office-caltech10", {"office-caltech10-domains": "amazon,imagenet"})


def test_stanford_cars_as_its_archives_unpack(tmp_path):
    """The annotations' 1-based classes as 0-196, the train part then the test part, each image resized to 64x64."""
    train, test = [0, 195, 17], [42, 3]
    files.write_stanford_cars(tmp_path, train, test)
    x, y = load_image_pool("stanford-cars", tmp_path)
    assert x.shape == (5, 3, 64, 64) and y.tolist() == train + test
    assert np.allclose(x[:, 0, 32, 32], y, atol=3) and registry.instance("stanford-cars", {}).info().num_classes == 196
    (tmp_path / "stanford_cars" / "cars_test_annos_withlabels.mat").unlink()
    cfg = ExperimentConfig.from_mapping({"dataset": "stanford-cars", "partition": "iid", "data-dir": str(tmp_path)})
    with pytest.raises(ConfigError, match=r"missing stanford_cars/cars_test_annos_withlabels\.mat; 'stanford-cars' has no download"):
        load_client_data(cfg, 0, 2)


def test_omniglot_characters_numbered_in_sorted_order_across_both_sets(tmp_path):
    """Both sets' characters, alphabet and character in sorted order (not the file system's), grey 28x28; each
    drawing's black top rows say which character it is."""
    drawn = files.write_omniglot(tmp_path, {
        "images_background": {"Latin/character02": 2, "Greek/character01": 3, "Latin/character01": 1},
        "images_evaluation": {"Atlantean/character01": 2},
    })
    x, y = load_image_pool("omniglot", tmp_path)
    assert x.shape == (8, 1, 28, 28) and y.tolist() == [label for _, label in drawn] == [0, 0, 0, 1, 2, 2, 3, 3]
    assert [c for c, _ in drawn][:4] == ["Greek/character01"] * 3 + ["Latin/character01"]
    black_rows = (x[:, 0, :, 14] < 128).sum(1)
    assert np.allclose(black_rows, 28 * 10 * (y + 1) / 105, atol=1)
    pool = registry.instance("omniglot", {"omniglot-labels": "alphabet"}).load_files(tmp_path, download=False)
    assert pool.y.tolist() == [1, 1, 1, 2, 2, 2, 0, 0]  # Atlantean, Greek, Latin
    assert pool.groups.tolist() == ["drawer01", "drawer02", "drawer03", "drawer01", "drawer01", "drawer02", "drawer01", "drawer02"]
    cfg = ExperimentConfig(dataset="omniglot", data_dir=str(tmp_path), partition="natural", min_test_samples=1)
    clients = [load_client_data(cfg, pid, 2) for pid in range(2)]
    assert [c.num_train + len(c.y_test) for c in clients] == [4, 3]
    few = r"'omniglot': the data set has 2 natural clients \(1 more have fewer than 2 samples.*\), fewer than the 3 clients asked for by "
    with pytest.raises(ConfigError, match=few + r"run config 'num-clients' = 3; at most 2 clients take one each"):
        load_client_data(ExperimentConfig(**{**vars(cfg), "num_clients": 3}), 0, 3)
    with pytest.raises(ConfigError, match=few + r"one client per node \(run config 'num-clients' = 0\): .*num-supernodes"):
        load_client_data(cfg, 0, 3)


def test_omniglot_needs_both_downloads_by_default(tmp_path):
    files.write_omniglot(tmp_path, {"images_background": {"Latin/character01": 2}})
    cfg = ExperimentConfig(dataset="omniglot", data_dir=str(tmp_path), partition="iid")
    with pytest.raises(ConfigError, match=r"found omniglot-py/images_background/<alphabet>/<character>/\*\.png; missing "
                                          r"omniglot-py/images_evaluation/<alphabet>/<character>/\*\.png; set 'data-dir' or 'download = true'$"):
        load_client_data(cfg, 0, 2)


def test_omniglot_small_sets_as_their_archives_unpack(tmp_path):
    """A small background set alone or with the evaluation set, read in the publisher's order whatever order the key
    lists them in, its classes counted as the publisher's folder holds them; one drawer per client still."""
    drawn = files.write_omniglot(tmp_path, {
        "images_evaluation": {"Atlantean/character01": 2},
        "images_background_small1": {"Latin/character02": 3, "Greek/character01": 1},
        "images_background_small2": {"Tagalog/character01": 2},
    })
    data = registry.instance("omniglot", {"omniglot-sets": "images_background_small1,images_evaluation"})
    pool = data.load_files(tmp_path, download=False)
    assert pool.y.tolist() == [label for _, label in drawn[:6]] == [0, 0, 1, 2, 2, 2]  # Atlantean, Greek, Latin
    assert np.allclose((pool.x[:, 0, :, 14] < 128).sum(1), 28 * 10 * (pool.y + 1) / 105, atol=1)
    assert data.info().num_classes == 659 + 136 and pool.groups.tolist()[:3] == ["drawer01", "drawer02", "drawer01"]
    alphabets = registry.instance("omniglot", {"omniglot-sets": "images_background_small2", "omniglot-labels": "alphabet"})
    assert alphabets.load_files(tmp_path, download=False).y.tolist() == [0, 0] and alphabets.info().num_classes == 5
    with pytest.raises(ValueError, match="one background set at most"):
        registry.instance("omniglot", {"omniglot-sets": "images_background,images_background_small1"})


def test_omniglot_small_set_missing_has_no_download(tmp_path):
    files.write_omniglot(tmp_path, {"images_evaluation": {"Atlantean/character01": 2}})
    cfg = ExperimentConfig(dataset="omniglot", data_dir=str(tmp_path), partition="iid",
                           options={"omniglot-sets": "images_evaluation,images_background_small2"})
    with pytest.raises(ConfigError, match=r"missing omniglot-py/images_background_small2/<alphabet>/<character>/\*\.png; "
                                          r"'omniglot' has no download: its files are .*images_background_small2\.zip"):
        load_client_data(cfg, 0, 2)


def test_covidx_list_files_and_image_folders(tmp_path):
    """train, val and test lists in that order (val optional), grey X-rays as colour 64x64; an image a list names but
    that is not there, and a class of COVIDx's older releases, are named."""
    files.write_covidx(tmp_path, {"train": ["positive", "negative", "negative"], "val": ["positive"], "test": ["negative", "positive"]})
    x, y = load_image_pool("covidx", tmp_path)
    assert x.shape == (6, 3, 64, 64) and y.tolist() == [1, 0, 0, 1, 0, 1]
    assert np.allclose(x[:, :, 30, 30], np.where(y == 1, 220, 30)[:, None], atol=3)
    (tmp_path / "covidx" / "val.txt").unlink()
    assert load_image_pool("covidx", tmp_path)[1].tolist() == [1, 0, 0, 0, 1]
    (tmp_path / "covidx" / "test" / "test-1.png").unlink()
    cfg = ExperimentConfig.from_mapping({"dataset": "covidx", "partition": "iid", "data-dir": str(tmp_path)})
    with pytest.raises(ConfigError, match=r"found covidx/train\.txt, covidx/test\.txt; missing covidx/test/test-1\.png; 'covidx' has no download"):
        load_client_data(cfg, 0, 2)
    (tmp_path / "covidx" / "train.txt").write_text("7 a.png COVID-19 cohen\n")
    with pytest.raises(ConfigError, match=r"train\.txt, line 1: expected 'patient file class source' with class negative or positive"):
        load_client_data(cfg, 0, 2)


#: DomainNet's lists number its 345 classes in sorted order: aircraft_carrier 0, bird 32, teapot 296, zebra 344
DOMAINNET = {
    "sketch": {"train": [("bird", 32), ("aircraft_carrier", 0), ("zebra", 344)], "test": [("teapot", 296), ("bird", 32)]},
    "clipart": {"train": [("zebra", 344), ("teapot", 296), ("bird", 32)], "test": [("aircraft_carrier", 0), ("zebra", 344)]},
}


@pytest.mark.parametrize(("classes", "labels", "test"), [
    ("fedbn", [0, 9, 4, 0, 9, 4, 0, 9], [0, 0, 1, 1, 0, 0, 0, 1]),
    ("all", [32, 0, 344, 296, 32, 344, 296, 32, 0, 344], [0, 0, 0, 1, 1, 0, 0, 0, 1, 1]),
])
def test_domainnet_split_lists_and_domains(tmp_path, classes, labels, test):
    """The domains in the order asked, each domain's train list then its test list (the publisher's split, kept with one
    domain per client); FedBN's classes relabelled 0-9 in its order, or the lists' 345 labels."""
    files.write_domainnet(tmp_path, DOMAINNET)
    options = {"domainnet-domains": "sketch,clipart", "domainnet-classes": classes}
    pool = registry.instance("domainnet", options).load_files(tmp_path, False)
    assert pool.x.shape == (len(labels), 3, 64, 64) and pool.y.tolist() == labels and pool.test.tolist() == [bool(t) for t in test]
    assert pool.domains.tolist() == ["sketch"] * (len(labels) // 2) + ["clipart"] * (len(labels) // 2)
    assert np.allclose(pool.x[:, 2, 32, 32], np.where(pool.domains == "clipart", 40, 0), atol=3)  # blue: the domain
    cfg = ExperimentConfig(dataset="domainnet", data_dir=str(tmp_path), partition="natural", min_test_samples=1, options=options)
    sketch = load_client_data(cfg, 0, 2)
    in_sketch = [(y, t) for y, t, d in zip(labels, test, pool.domains) if d == "sketch"]
    assert sorted(sketch.y_train.tolist()) == sorted(y for y, t in in_sketch if not t)
    assert sorted(sketch.y_test.tolist()) == sorted(y for y, t in in_sketch if t)


def test_domainnet_names_a_missing_image_and_a_missing_list(tmp_path):
    files.write_domainnet(tmp_path, DOMAINNET)
    (tmp_path / "domainnet" / "sketch" / "bird" / "sketch_test_001.jpg").unlink()
    cfg = ExperimentConfig(dataset="domainnet", data_dir=str(tmp_path), partition="iid", options={"domainnet-domains": "sketch,clipart"})
    with pytest.raises(ConfigError, match=r"missing domainnet/sketch/bird/sketch_test_001\.jpg; 'domainnet' has no download"):
        load_client_data(cfg, 0, 2)
    cfg = ExperimentConfig(dataset="domainnet", data_dir=str(tmp_path), partition="iid", options={"domainnet-domains": "real"})
    with pytest.raises(ConfigError, match=r"no files under data-dir .*: missing domainnet/real_train\.txt, domainnet/real_test\.txt; "):
        load_client_data(cfg, 0, 2)
