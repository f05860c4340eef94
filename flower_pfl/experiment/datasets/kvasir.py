"""Kvasir v2 (Pogorelov et al. 2017): endoscopy images, from its archive's class folders."""

from __future__ import annotations

from dataclasses import dataclass

from flower_pfl.experiment.datasets.base import ClassFolders


@dataclass
class Kvasir(ClassFolders):
    """Kvasir v2 (Pogorelov et al. 2017): 8,000 colour endoscopy images of the gastrointestinal tract, 1,000 of each
    of 8 classes (landmarks, findings, polyp removal), 720x576 to 1920x1072 pixels, resized to 64x64 as PFLlib does."""

    name = "kvasir"
    folder, side = "kvasir-dataset-v2", 64
    #: the archive's class folders, in sorted order (torchvision's ImageFolder and PFLlib number them so)
    class_names = ("dyed-lifted-polyps", "dyed-resection-margins", "esophagitis", "normal-cecum", "normal-pylorus",
                   "normal-z-line", "polyps", "ulcerative-colitis")
    files_text = f"the archive's `{folder}/<class>/*.jpg` (kvasir-dataset-v2.zip unpacked)"
