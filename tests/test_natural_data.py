"""The data sets with natural clients from their publishers' files (natural_files.py): WILDS's Camelyon17
(hospitals) and iWildCam (camera traps), UCI's PAMAP2 (subjects), through the loaders and ``load_client_data``."""

import re
import shutil

import natural_files as files
import numpy as np
import pytest
import torch

from flower_pfl.experiment.clients import load_client_data
from flower_pfl.experiment.config import ConfigError, ExperimentConfig
from flower_pfl.experiment.data.files import MalformedFile, MissingFiles
from flower_pfl.experiment.data.images import to_float
from flower_pfl.experiment.datasets import registry
from flower_pfl.experiment.datasets.base import Where
from flower_pfl.experiment.models.registry import build_model


def pool_of(name, root, **options):
    """Data set ``name``'s samples from its files under ``root``."""
    return registry.instance(name, options).load_files(root, download=False)


def both_parts(c):
    """A client's samples and labels, train part then test part."""
    return np.concatenate([c.x_train.numpy(), c.x_test.numpy()]), np.concatenate([c.y_train.numpy(), c.y_test.numpy()])


@pytest.fixture(scope="module")
def camelyon(tmp_path_factory):
    root = tmp_path_factory.mktemp("camelyon")
    return root, files.write_camelyon17(root)


@pytest.fixture(scope="module")
def iwildcam(tmp_path_factory):
    root = tmp_path_factory.mktemp("iwildcam")
    return root, files.write_iwildcam(root)


@pytest.fixture(scope="module")
def pamap2(tmp_path_factory):
    root = tmp_path_factory.mktemp("pamap2")
    return root, files.write_pamap2(root)


# --- Camelyon17 ------------------------------------------------------------------------------------------------
def test_camelyon17_patches_labels_and_hospitals(camelyon):
    root, written = camelyon
    pool = pool_of("camelyon17", root, **{"camelyon17-per-hospital": 0})
    assert pool.x.shape == (30, 3, 96, 96) and pool.x.dtype == np.uint8
    assert np.array_equal(pool.x, written["x"])  # the PNGs' pixels, channels first, in metadata.csv's order
    assert np.array_equal(pool.y, written["y"]) and set(pool.y) == {0, 1}
    assert list(pool.groups) == [f"hospital{c}" for c in written["center"]] and pool.test is None
    assert registry.instance("camelyon17", {}).info().input_shape == (3, 96, 96)
    assert registry.keys_of("camelyon17") == ("camelyon17-per-hospital",)


def test_camelyon17_one_hospital_per_client(camelyon):
    root, written = camelyon
    cfg = ExperimentConfig(dataset="camelyon17", partition="natural", data_dir=str(root), min_test_samples=1)
    data = [load_client_data(cfg, pid, 5) for pid in range(5)]
    assert [c.group for c in data] == [f"hospital{h}" for h in range(5)]
    for h, c in enumerate(data):
        x, y = both_parts(c)
        mine = np.flatnonzero(written["center"] == h)
        order = [next(i for i in mine if np.array_equal(to_float(written["x"][i]), s)) for s in x]  # every patch once
        assert sorted(order) == list(mine) and np.array_equal(y, written["y"][order])
        assert c.num_train == 4 and len(c.y_test) == 2


def test_camelyon17_per_hospital_draw_is_seeded_and_reads_only_the_drawn(tmp_path):
    written = files.write_camelyon17(tmp_path)
    data = registry.instance("camelyon17", {"camelyon17-per-hospital": 3})
    draw = lambda seed: data.pool(Where(data_dir=str(tmp_path)), 5, seed)
    first, again, other = draw(7), draw(7), draw(8)
    assert sorted(first.groups) == [f"hospital{h}" for h in range(5) for _ in range(3)]
    assert np.array_equal(first.x, again.x) and np.array_equal(first.y, again.y)
    assert not np.array_equal(first.x, other.x)
    drawn = [next(i for i, w in enumerate(written["x"]) if np.array_equal(w, s)) for s in first.x]
    assert drawn == sorted(drawn) and np.array_equal(first.y, written["y"][drawn])  # in the file's order
    cfg = ExperimentConfig(dataset="camelyon17", partition="natural", data_dir=str(tmp_path), min_test_samples=1, data_seed=7,
                           options={"camelyon17-per-hospital": 3})
    x, _ = both_parts(load_client_data(cfg, 0, 5))  # a run draws with its data seed
    mine = first.x[first.groups == "hospital0"]
    assert sorted(next(j for j, w in enumerate(mine) if np.array_equal(to_float(w), s)) for s in x) == [0, 1, 2]
    for i in set(range(30)) - set(drawn):  # the patches not drawn are never read
        (tmp_path / "camelyon17_v1.0" / written["path"][i]).unlink()
    assert np.array_equal(draw(7).x, first.x)
    with pytest.raises(MissingFiles, match=r"missing camelyon17_v1.0/patches/patient_\d+_node_\d/patch_"):
        draw(8)


# --- iWildCam --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("minimum", "traps"), [(3, (2, 11)), (0, (2, 5, 7, 11)), (100, ())])
def test_iwildcam_photos_of_the_traps_kept(iwildcam, minimum, traps):
    root, written = iwildcam
    pool = pool_of("iwildcam", root, **{"iwildcam-min-samples": minimum})
    rows = np.flatnonzero(np.isin(written["trap"], traps))
    assert pool.x.shape == (len(rows), 3, 64, 64) and pool.x.dtype == np.uint8  # every size resized to 64x64
    assert np.array_equal(pool.y, written["y"][rows])  # WILDS's labels as they are (181 among them)
    assert list(pool.groups) == [f"trap{t:03d}" for t in written["trap"][rows]]
    for image, colour in zip(pool.x, written["colour"][rows]):  # solid JPEGs: the colour, within JPEG's rounding
        assert np.abs(image.astype(int) - np.asarray(colour).reshape(3, 1, 1)).max() <= 3
    assert registry.instance("iwildcam", {}).info().num_classes == 182


def test_iwildcam_one_trap_per_client(iwildcam):
    root, written = iwildcam
    cfg = ExperimentConfig(dataset="iwildcam", partition="natural", data_dir=str(root), min_test_samples=1,
                           options={"iwildcam-min-samples": 3})
    data = [load_client_data(cfg, pid, 2) for pid in range(2)]
    assert [c.group for c in data] == ["trap002", "trap011"]
    for trap, c in zip((2, 11), data):
        x, y = both_parts(c)
        assert sorted(y) == sorted(files.IWILDCAM_TRAPS[trap]) and x.shape[1:] == (3, 64, 64)
        assert x.min() >= -1 and x.max() <= 1
    with pytest.raises(ValueError, match="has 2 natural clients, fewer than the 3"):
        load_client_data(cfg, 0, 3)


# --- PAMAP2 ----------------------------------------------------------------------------------------------------
#: PAMAP2's activity ids and PFLlib's labels of them
REMAP = {24: 0, 1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 6: 6, 7: 7, 12: 8, 13: 9, 16: 10, 17: 11}


def expected_windows(subject):
    """A subject's windows by hand: protocol bouts A (rows 40-423: windows at 40 and 168), B (424-723: at 424),
    rope jumping (744-999: at 744), a walk of 255 rows (none); the Optional file's ironing (310-569: at 310).
    Signal k at row r reads 10 (k + 1) (k + r mod 50), its largest absolute value 1000 (k + 1) (2000 (k + 1)
    with an Optional file): scaled, (k + r mod 50) / 100 (or / 200); NaN readings 0."""
    a, b = files.PAMAP2_BOUTS[subject]
    optional = subject in files.PAMAP2_OPTIONAL
    starts = [(40, a), (168, a), (424, b), (744, 24)] + ([(310, 17)] if optional else [])
    k, t = np.arange(27)[:, None], np.arange(256)[None, :]
    x = np.stack([(k + (first + t) % 50) / (200 if optional else 100) for first, _ in starts]).astype(np.float32)
    if subject == 102:
        x[0, 0, 10:20] = 0  # signal 0's rows 50-59 missing, within the window at row 40
    if subject == 109:
        x[:, 26] = 0  # a signal never read: 0, not NaN
    return x, np.asarray([REMAP[activity] for _, activity in starts])


def test_pamap2_windows_labels_scaling_and_nan(pamap2):
    root, _ = pamap2
    pool = pool_of("pamap2", root)
    assert pool.x.shape == (9 * 4 + 2, 27, 256) and pool.x.dtype == np.float32 and np.isfinite(pool.x).all()
    assert registry.instance("pamap2", {}).info().input_shape == (27, 256)
    for subject in files.PAMAP2_BOUTS:
        mine = np.flatnonzero(pool.groups == f"subject{subject}")
        x, y = expected_windows(subject)
        assert np.array_equal(pool.y[mine], y)
        assert np.allclose(pool.x[mine], x, rtol=1e-6, atol=0)
    assert list(dict.fromkeys(pool.groups)) == [f"subject{s}" for s in range(101, 110)]


def test_pamap2_one_subject_per_client_and_har_cnn(pamap2):
    root, _ = pamap2
    cfg = ExperimentConfig(dataset="pamap2", partition="natural", model="har-cnn", data_dir=str(root), min_test_samples=1)
    data = [load_client_data(cfg, pid, 9) for pid in range(9)]
    assert [c.group for c in data] == [f"subject{s}" for s in range(101, 110)]
    for subject, c in zip(range(101, 110), data):
        x, y = both_parts(c)
        want_x, want_y = expected_windows(subject)
        assert sorted(y) == sorted(want_y) and c.num_train == round(0.75 * len(want_y))
        assert all(any(np.allclose(w, s, rtol=1e-6, atol=0) for w in want_x) for s in x)
    model = build_model("har-cnn", registry.instance("pamap2", {}).info())
    assert model(data[0].x_train).shape == (data[0].num_train, 12)


# --- every set through load_client_data, and its files missing or malformed -------------------------------------
@pytest.mark.parametrize(("name", "fixture", "options", "shape"), [
    ("camelyon17", "camelyon", {}, (3, 96, 96)),
    ("iwildcam", "iwildcam", {"iwildcam-min-samples": 0}, (3, 64, 64)),
    ("pamap2", "pamap2", {}, (27, 256)),
])
def test_iid_clients_get_samples_of_the_shape(request, name, fixture, options, shape):
    root, _ = request.getfixturevalue(fixture)
    cfg = ExperimentConfig(dataset=name, partition="iid", data_dir=str(root), options=options)
    for c in (load_client_data(cfg, pid, 2) for pid in range(2)):
        assert c.num_train >= 1 and len(c.y_test) >= 1
        assert tuple(c.x_train.shape[1:]) == shape and c.x_train.dtype == torch.float32 and c.y_train.dtype == torch.int64


@pytest.mark.parametrize(("name", "expected"), [
    ("camelyon17", "camelyon17_v1.0/metadata.csv"),
    ("iwildcam", "iwildcam_v2.0/metadata.csv"),
    ("pamap2", "PAMAP2_Dataset/Protocol/subject101.dat"),
])
def test_missing_files_are_named(tmp_path, name, expected):
    cfg = ExperimentConfig(dataset=name, partition="natural", data_dir=str(tmp_path))
    with pytest.raises(ConfigError, match=f"'{name}': no files under data-dir .*{re.escape(expected)}.*has no download"):
        load_client_data(cfg, 0, 2)


def _copy(source, tmp_path):
    shutil.copytree(source, tmp_path, dirs_exist_ok=True)
    return tmp_path


def test_a_listed_image_or_subject_file_missing_is_named(camelyon, iwildcam, pamap2, tmp_path):
    cam = _copy(camelyon[0], tmp_path / "c")
    (cam / "camelyon17_v1.0" / camelyon[1]["path"][4]).unlink()
    wild = _copy(iwildcam[0], tmp_path / "w")
    (wild / "iwildcam_v2.0" / "train" / iwildcam[1]["filename"][0]).unlink()
    pam = _copy(pamap2[0], tmp_path / "p")
    (pam / "PAMAP2_Dataset" / "Protocol" / "subject105.dat").unlink()
    for name, root, missing in (("camelyon17", cam, f"camelyon17_v1.0/{camelyon[1]['path'][4]}"),
                                ("iwildcam", wild, f"iwildcam_v2.0/train/{iwildcam[1]['filename'][0]}"),
                                ("pamap2", pam, "PAMAP2_Dataset/Protocol/subject105.dat")):
        cfg = ExperimentConfig(dataset=name, partition="natural", data_dir=str(root), options={"iwildcam-min-samples": 0}
                               if name == "iwildcam" else {})
        with pytest.raises(ConfigError, match=f"files missing under data-dir .*; missing {re.escape(missing)}"):
            load_client_data(cfg, 0, 2)


def _rewrite(path, old, new):
    path.write_text(path.read_text().replace(old, new, 1))


@pytest.mark.parametrize(("name", "change", "message"), [
    ("camelyon17", ("slide,center,split", "slide,centre,split"), "metadata.csv: not WILDS's metadata.csv: it has no column center"),
    ("camelyon17", ("\n0,000,0,0,0,1,", "\n0,000,0,0,0,O,"), "metadata.csv: row 1: tumor = 'O', expected an integer in [0, 1]"),
    ("iwildcam", (",146,", ",182,"), "metadata.csv: row 14: y = '182', expected an integer in [0, 181]"),
    ("iwildcam", ("location_remapped", "location_id"), "it has no column location_remapped"),
])
def test_malformed_metadata_is_named(camelyon, iwildcam, tmp_path, name, change, message):
    folder = {"camelyon17": "camelyon17_v1.0", "iwildcam": "iwildcam_v2.0"}[name]
    root = _copy((camelyon if name == "camelyon17" else iwildcam)[0], tmp_path)
    _rewrite(root / folder / "metadata.csv", *change)
    options = {"iwildcam-min-samples": 0} if name == "iwildcam" else {}
    with pytest.raises(MalformedFile, match=re.escape(message)):
        pool_of(name, root, **options)
    cfg = ExperimentConfig(dataset=name, partition="natural", data_dir=str(root), options=options)
    with pytest.raises(ConfigError, match=f"'{name}': a file under data-dir cannot be read: .*{re.escape(folder)}/metadata.csv"):
        load_client_data(cfg, 0, 2)


def test_a_pamap2_file_of_other_columns_is_named(pamap2, tmp_path):
    root = _copy(pamap2[0], tmp_path)
    path = root / "PAMAP2_Dataset" / "Optional" / "subject105.dat"
    path.write_text("".join(" ".join(line.split()[:53]) + "\n" for line in path.read_text().splitlines()))
    with pytest.raises(MalformedFile, match=re.escape(f"{path}: 53 columns a line, PAMAP2's .dat files have 54")):
        pool_of("pamap2", root)


# --- python -m flower_pfl check stops where the run stops ---------------------------------------------------------
@pytest.mark.parametrize(("name", "fixture", "options", "held"), [
    ("camelyon17", "camelyon", {"model": "cnn"}, 5),  # hospitals
    ("iwildcam", "iwildcam", {"model": "cnn", "iwildcam-min-samples": 3}, 2),  # camera traps of more than 3 photos
    ("pamap2", "pamap2", {"model": "har-cnn"}, 9),  # subjects
])
def test_check_refuses_more_clients_than_the_files_hold_in_the_runs_words(request, capsys, tmp_path, monkeypatch, name, fixture,
                                                                          options, held):
    from flower_pfl.tools import check

    monkeypatch.chdir(tmp_path)
    root, _ = request.getfixturevalue(fixture)
    keys = {"dataset": name, "partition": "natural", "data-dir": str(root), "min-test-samples": 1, **options}
    with pytest.raises(ConfigError, match=f"has {held} natural clients, fewer than the {held + 1} clients asked for") as run:
        load_client_data(ExperimentConfig.from_mapping({**keys, "num-clients": held + 1}), 0, held + 1)
    settings = " ".join(f"{key}={value!r}" for key, value in keys.items())
    assert check.main(["--run-config", f"{settings} num-clients={held + 1}"]) == 2
    assert capsys.readouterr().err == f"flower-pfl: {run.value}\n"
    assert check.main(["--run-config", settings, "--federation-config", f"num-supernodes={held}"]) == 0


def test_check_names_a_listed_image_missing_as_the_run_does(camelyon, capsys, tmp_path, monkeypatch):
    from flower_pfl.tools import check

    monkeypatch.chdir(tmp_path)
    root = _copy(camelyon[0], tmp_path / "c")
    (root / "camelyon17_v1.0" / camelyon[1]["path"][4]).unlink()
    keys = {"dataset": "camelyon17", "partition": "natural", "data-dir": str(root), "model": "cnn", "num-clients": 2}
    with pytest.raises(ConfigError) as run:
        load_client_data(ExperimentConfig.from_mapping(keys), 0, 2)
    assert check.main(["--run-config", " ".join(f"{key}={value!r}" for key, value in keys.items())]) == 2
    assert capsys.readouterr().err == f"flower-pfl: {run.value}\n" and camelyon[1]["path"][4] in str(run.value)
