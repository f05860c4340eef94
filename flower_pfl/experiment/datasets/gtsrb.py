"""GTSRB (Stallkamp et al. 2012): German traffic signs, from the published archives or torchvision's download."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flower_pfl.engine.extras import require
from flower_pfl.experiment.data.columns import integers, read_columns
from flower_pfl.experiment.data.files import MissingFiles, located, require_listed
from flower_pfl.experiment.data.images import read_images
from flower_pfl.experiment.data.info import DataInfo
from flower_pfl.experiment.datasets.base import DataSet, Pool

#: the folder under data-dir the archives are unpacked into (as torchvision's download does)
FOLDER = "gtsrb"
#: where the training images' class folders ``00000`` to ``00042`` are under ``FOLDER``, in the order looked for, and
#: what leaves them there
TRAINING = {"GTSRB/Final_Training/Images": "GTSRB_Final_Training_Images.zip",
            "GTSRB/Training": "torchvision's download, GTSRB-Training_fixed.zip"}
#: the test images and their labels under ``FOLDER`` (the same with torchvision's download), and their archives
TEST_IMAGES, TEST_LABELS = "GTSRB/Final_Test/Images", "GT-final_test.csv"
TEST = {f"{TEST_IMAGES}/*.ppm": "GTSRB_Final_Test_Images.zip", TEST_LABELS: "GTSRB_Final_Test_GT.zip"}
CLASSES, SIDE = 43, 32


def class_folders(layout: str) -> list[str]:
    """The training layout's class folders, relative to data-dir."""
    return [f"{FOLDER}/{layout}/{c:05d}" for c in range(CLASSES)]


@dataclass
class GTSRB(DataSet):
    """GTSRB (Stallkamp et al. 2012): 51,839 colour photographs of 43 kinds of German traffic sign (39,209 training
    and 12,630 test images; torchvision's download has 26,640 training images), 15x15 to 250x250 pixels, resized to
    32x32 as FL-bench does; the training and test parts pooled."""

    name = "gtsrb"
    kind = "image"
    downloadable = True
    files_text = (f"the published archives unpacked into `{FOLDER}/`: GTSRB_Final_Training_Images.zip "
                  f"(`{FOLDER}/GTSRB/Final_Training/Images/<class>/*.ppm`), GTSRB_Final_Test_Images.zip "
                  f"(`{FOLDER}/{TEST_IMAGES}/*.ppm`) and GTSRB_Final_Test_GT.zip (`{FOLDER}/{TEST_LABELS}`); or torchvision's "
                  f"download, the same but for its training images in `{FOLDER}/GTSRB/Training/<class>/`")

    def info(self) -> DataInfo:
        return DataInfo((3, SIDE, SIDE), CLASSES, self.kind)

    def expected_files(self) -> list[str]:
        """The published archives' files (torchvision's training folder is read in place of theirs: ``locate``)."""
        return [f"{FOLDER}/{next(iter(TRAINING))}/<class>/*.ppm", *(f"{FOLDER}/{name}" for name in TEST)]

    def training(self, root: Path) -> tuple[str, list[str]]:
        """The first layout of ``TRAINING`` holding every class folder, else the fullest; and the folders it lacks."""
        gaps = {layout: [f"{folder}/" for folder in class_folders(layout) if not _has_images(Path(root) / folder)]
                for layout in TRAINING}
        layout = min(TRAINING, key=lambda name: len(gaps[name]))
        return layout, gaps[layout]

    def locate(self, root: Path) -> tuple[list[str], list[str]]:
        """The training images (``training``; where no layout holds any: each layout with what leaves it) and the
        test files, each missing file with its archive."""
        found, missing = located(Path(root), [f"{FOLDER}/{name}" for name in TEST])
        missing = [f"{name} ({TEST[name.removeprefix(f'{FOLDER}/')]})" for name in missing]
        layout, gap = self.training(root)
        if len(gap) == CLASSES:
            missing.insert(0, " or ".join(f"{FOLDER}/{name}/<class>/*.ppm ({source})" for name, source in TRAINING.items()))
        else:
            found.insert(0, f"{FOLDER}/{layout}/<class>/*.ppm")
            missing[:0] = gap[:5] + ([f"and {len(gap) - 5} more class folders"] if len(gap) > 5 else [])
        return found, missing

    def load_files(self, root: Path, download: bool) -> Pool:
        """The training images (label: their class folder's number) in sorted order, then the test images in
        ``GT-final_test.csv``'s order (label: its ClassId), each resized to 32x32 (bilinear), as torchvision reads
        them; ``download`` fetches torchvision's files of the parts that are missing."""
        root = Path(root)
        if download:
            require("torchvision", why="dataset = 'gtsrb' with download = true")
            from torchvision.datasets import GTSRB as Download

            test_missing = located(root, [f"{FOLDER}/{name}" for name in TEST])[1]
            for split in [s for s, needed in (("train", self.training(root)[1]), ("test", test_missing)) if needed]:
                Download(str(root), split=split, download=True)
        found, missing = self.locate(root)
        if missing:
            raise MissingFiles(root, found, missing)
        paths: list[Path] = []
        labels: list[int] = []
        for label, folder in enumerate(class_folders(self.training(root)[0])):
            images = sorted((root / folder).glob("*.ppm"))
            paths += images
            labels += [label] * len(images)
        table = root / FOLDER / TEST_LABELS
        truth = read_columns(table, ("Filename", "ClassId"), f"GTSRB's {TEST_LABELS} (GTSRB_Final_Test_GT.zip)", delimiter=";")
        tests = [root / FOLDER / TEST_IMAGES / name for name in truth["Filename"]]
        require_listed(root, [f"{FOLDER}/{TEST_LABELS}"], tests)
        y = np.concatenate([np.asarray(labels, dtype=np.int64), integers(table, "ClassId", truth["ClassId"], range(CLASSES))])
        return Pool(read_images(paths + tests, SIDE), y)


def _has_images(folder: Path) -> bool:
    return next(folder.glob("*.ppm"), None) is not None
