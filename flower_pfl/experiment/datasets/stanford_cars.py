"""Stanford Cars (Krause et al. 2013), through torchvision's files."""

from __future__ import annotations

from dataclasses import dataclass

from flower_pfl.experiment.datasets.base import ResizedTorchvisionImages


@dataclass
class StanfordCars(ResizedTorchvisionImages):
    """Stanford Cars (Krause et al. 2013): 16,185 colour photographs of 196 car models (make, model, year), resized
    to 64x64 as PFLlib does; its train and test parts pooled."""

    name = "stanford-cars"
    SIDE = 64
    downloadable = False  # torchvision: "the original URL is broken"
    files_text = ("torchvision's `stanford_cars/`: `devkit/cars_meta.mat`, `devkit/cars_train_annos.mat`, `cars_train/*.jpg`, "
                  "`cars_test/*.jpg` and `cars_test_annos_withlabels.mat` (car_devkit.tgz, cars_train.tgz and cars_test.tgz "
                  "unpacked there, with the test labels' .mat beside them, as the Kaggle copy ships them)")
    needs = "scipy"  # its .mat files
    torchvision_class, parts, classes = "StanfordCars", ("train", "test"), 196
    files = ("stanford_cars/devkit/cars_meta.mat", "stanford_cars/devkit/cars_train_annos.mat", "stanford_cars/cars_train/*.jpg",
             "stanford_cars/cars_test/*.jpg", "stanford_cars/cars_test_annos_withlabels.mat")
