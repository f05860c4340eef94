"""CIFAR-100 (Krizhevsky 2009), through torchvision's files or the hub."""

from __future__ import annotations

import pickle
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from flower_pfl.engine.params import one_of, param
from flower_pfl.experiment.data.hub import Hub
from flower_pfl.experiment.data.info import DataInfo
from flower_pfl.experiment.datasets.base import Pool, TorchvisionImages

#: the number of classes of each labelling
LABELS = {"fine": 100, "coarse": 20}


@dataclass
class CIFAR100(TorchvisionImages):
    """CIFAR-100 (Krizhevsky 2009): 60,000 colour 32x32 images of 100 classes, or of their 20 superclasses
    (`cifar100-labels`; train and test pooled)."""

    name = "cifar100"
    torchvision_class, shape = "CIFAR100", (3, 32, 32)
    files = ("cifar-100-python/train", "cifar-100-python/test", "cifar-100-python/meta")
    hub = Hub("uoft-cs/cifar100", x="img", y="fine_label")
    files_text = "torchvision's `cifar-100-python/`"

    labels: str = param("fine", key="cifar100-labels", must=one_of(*LABELS),
                        doc="'fine': the 100 classes; 'coarse': the 20 superclasses (FL-bench's --super_class)")

    def info(self) -> DataInfo:
        return DataInfo(self.shape, LABELS[self.labels], self.kind)

    def load_files(self, root: Path, download: bool) -> Pool:
        pool = super().load_files(root, download)
        if self.labels == "fine":
            return pool
        coarse = []  # torchvision reads the fine labels only; the coarse ones sit beside them in the same files
        for part in ("train", "test"):
            with (Path(root) / "cifar-100-python" / part).open("rb") as file:
                coarse.append(np.asarray(pickle.load(file, encoding="latin1")["coarse_labels"], dtype=np.int64))
        return Pool(pool.x, np.concatenate(coarse))

    def hub_spec(self) -> Hub:
        assert self.hub is not None
        return replace(self.hub, y=f"{self.labels}_label")
