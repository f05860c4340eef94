"""DomainNet (Peng et al. 2019) under feature shift: clients grouped by domain, with its split lists."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flower_pfl.engine.params import comma_list, one_of, param, some_of
from flower_pfl.experiment.data.files import MalformedFile, require_files, require_listed
from flower_pfl.experiment.data.images import read_images
from flower_pfl.experiment.data.info import DataInfo
from flower_pfl.experiment.datasets.base import DataSet, Pool

FOLDER = "domainnet"
DOMAINS = ("clipart", "infograph", "painting", "quickdraw", "real", "sketch")
#: FedBN's ten classes (Li et al. 2021), in its label order
FEDBN_CLASSES = ("bird", "feather", "headphones", "ice_cream", "teapot", "tiger", "whale", "windmill", "wine_glass", "zebra")
#: DomainNet's classes; its split lists number them 0-344 in sorted order
ALL_CLASSES = 345
SIDE = 64


@dataclass
class DomainNet(DataSet):
    """DomainNet (Peng et al. 2019): some 586,000 colour images of 345 classes in six domains (clipart, infograph,
    painting, quickdraw, real, sketch), resized to 64x64 as PFLlib and FL-bench do; FedBN's ten classes or all
    345; client i holds domain i mod their number, and one domain per client keeps the publisher's train/test split."""

    name = "domainnet"
    kind = "image"
    natural = "domain"
    files_text = (f"the domains' archives (clipart.zip, ...) unpacked into `{FOLDER}/` (`{FOLDER}/<domain>/<class>/*.jpg`) "
                  f"with the publisher's split lists beside them (`{FOLDER}/<domain>_train.txt`, `<domain>_test.txt`)")

    domains: str = param(",".join(DOMAINS), key="domainnet-domains", must=some_of(DOMAINS, "domains"),
                         doc="the domains, comma-separated: client i holds domain i mod their number (clipart, infograph, painting, "
                             "quickdraw, real, sketch)")
    classes: str = param("fedbn", key="domainnet-classes", must=one_of("fedbn", "all"),
                         doc="fedbn: FedBN's ten classes (bird, feather, headphones, ice_cream, teapot, tiger, whale, windmill, "
                             "wine_glass, zebra); all: the 345")

    def info(self) -> DataInfo:
        return DataInfo((3, SIDE, SIDE), len(FEDBN_CLASSES) if self.classes == "fedbn" else ALL_CLASSES, self.kind)

    def expected_files(self) -> list[str]:
        return [f"{FOLDER}/{d}_{part}.txt" for d in comma_list(self.domains) for part in ("train", "test")]

    def load_files(self, root: Path, download: bool) -> Pool:
        """Each domain's split lists (lines ``<domain>/<class>/<file>.jpg <label>``), train then test; with FedBN's
        classes only their lines, labelled in FedBN's order. Every image a list names must be there."""
        require_files(root, self.expected_files())
        base = Path(root) / FOLDER
        chosen = {c: i for i, c in enumerate(FEDBN_CLASSES)} if self.classes == "fedbn" else None
        paths: list[Path] = []
        labels: list[int] = []
        domains: list[str] = []
        test: list[bool] = []
        for domain in comma_list(self.domains):
            for part in ("train", "test"):
                listing = base / f"{domain}_{part}.txt"
                for number, line in enumerate(listing.read_text().splitlines(), 1):
                    fields = line.split()
                    if not fields:
                        continue
                    parts = fields[0].split("/")
                    if len(fields) != 2 or len(parts) != 3 or not fields[1].isdigit() or int(fields[1]) >= ALL_CLASSES:
                        raise MalformedFile(f"{listing}, line {number}: expected '<domain>/<class>/<file> <label 0-344>', got {line.strip()!r}")
                    if chosen is not None and parts[1] not in chosen:
                        continue
                    paths.append(base / fields[0])
                    labels.append(chosen[parts[1]] if chosen is not None else int(fields[1]))
                    domains.append(domain)
                    test.append(part == "test")
        require_listed(Path(root), self.expected_files(), paths)
        return Pool(read_images(paths, SIDE), np.asarray(labels), domains=np.asarray(domains, dtype=object), test=np.asarray(test))
