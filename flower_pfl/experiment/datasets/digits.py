"""Digits under feature shift: clients grouped by digit data set (FedBN's and PFLlib's Digit5 setting)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flower_pfl.engine.params import NON_NEGATIVE_INT, comma_list, param, some_of
from flower_pfl.experiment.data.images import resize
from flower_pfl.experiment.data.info import DataInfo
from flower_pfl.experiment.datasets.base import DATA_SOURCES, HUB, DataSet, Pool, Where
from flower_pfl.experiment.datasets.mnist import MNIST
from flower_pfl.experiment.datasets.mnist_m import MNISTM
from flower_pfl.experiment.datasets.svhn import SVHN
from flower_pfl.experiment.datasets.usps import USPS

#: the digit data sets a client's domain can be
DOMAINS: dict[str, type[DataSet]] = {"mnist": MNIST, "svhn": SVHN, "usps": USPS, "mnist-m": MNISTM}
#: every domain's images are resized to this side, in colour (PFLlib's Digit5)
SIDE, CHANNELS = 32, 3


@dataclass
class Digits(DataSet):
    """Digits under feature shift (FedBN, Li et al. 2021; PFLlib's Digit5): one label space (the 10 digits), each
    client's data from one digit data set, resized to colour 32x32; clients take the domains in turn."""

    name = "digits"
    kind = "image"
    natural = "domain"
    files_text = "each domain's own (MNIST, SVHN, USPS: torchvision's; MNIST-M: the hub's)"
    downloadable = True

    domains: str = param("mnist,svhn,usps", key="digits-domains", must=some_of(DOMAINS, "domains"),
                         doc="the digit data sets, comma-separated: client i holds domain i mod their number (mnist, svhn, usps, mnist-m)")
    per_domain: int = param(0, key="digits-per-domain", must=NON_NEGATIVE_INT,
                            doc="samples drawn from each domain, seeded (0: all; PFLlib's Digit5 draws about 34,000)")

    @classmethod
    def sources(cls) -> tuple[str, ...]:
        return DATA_SOURCES  # each domain's own files, or the hub's

    def info(self) -> DataInfo:
        return DataInfo((CHANNELS, SIDE, SIDE), 10, self.kind)

    def expected_files(self) -> list[str]:
        return [f for d in comma_list(self.domains) for f in DOMAINS[d]().expected_files()]

    def pool(self, where: Where, num_partitions: int, seed: int) -> Pool:
        """Every domain's samples (``domains``: the domain's name), resized; ``digits-per-domain`` of each."""
        if where.source == HUB and where.hub_dataset:
            raise ValueError("run config 'hub-dataset' is invalid for dataset 'digits': leave it empty; each domain is read "
                             "from <data-dir>/<hub id> where that folder exists, else from the hub")
        pools = []
        for i, name in enumerate(comma_list(self.domains)):
            part = DOMAINS[name]().pool(where, num_partitions, seed)
            if self.per_domain and len(part.y) > self.per_domain:
                part = part.take(np.sort(np.random.default_rng([seed, 4, i]).choice(len(part.y), self.per_domain, replace=False)))
            pools.append(Pool(resize(part.x, SIDE, CHANNELS), part.y, domains=np.full(len(part.y), name, dtype=object)))
        return Pool.join(pools)
