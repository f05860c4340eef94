"""Synthetic(α, β) (Shamir et al., as FedProx, pFedMe and FedMCSA generate it): one generated user per client."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flower_pfl.engine.params import NON_NEGATIVE, param
from flower_pfl.experiment.data.info import DataInfo
from flower_pfl.experiment.data.synthetic import DIM, NUM_CLASSES, generate_synthetic
from flower_pfl.experiment.datasets.base import DATA_SOURCES, DataSet, Pool, Where


@dataclass
class Synthetic(DataSet):
    """Synthetic(α, β) (FedProx, pFedMe, FedMCSA): 60 features, 10 classes, each user its own logistic model
    (``flower_pfl.experiment.data.synthetic``); generated, one user per client."""

    name = "synthetic"
    kind = "features"
    natural = "generated user"
    hub = None
    files_text = "generated: no files"

    alpha: float = param(0.5, key="synthetic-alpha", must=NON_NEGATIVE, doc="α: how far the users' models differ")
    beta: float = param(0.5, key="synthetic-beta", must=NON_NEGATIVE, doc="β: how far the users' inputs differ")

    @classmethod
    def sources(cls) -> tuple[str, ...]:
        return DATA_SOURCES  # generated: the source is not read

    def info(self) -> DataInfo:
        return DataInfo((DIM,), NUM_CLASSES, self.kind)

    def pool(self, where: Where, num_partitions: int, seed: int) -> Pool:
        """``num_partitions`` users, one after the other (``groups``: the user)."""
        users = generate_synthetic(self.alpha, self.beta, num_users=num_partitions, seed=seed)
        groups = np.concatenate([np.full(len(y), i) for i, (_, y) in enumerate(users)])
        return Pool(np.concatenate([x for x, _ in users]), np.concatenate([y for _, y in users]), groups)

    def load_files(self, root: Path, download: bool) -> Pool:
        raise NotImplementedError("Synthetic is generated")
