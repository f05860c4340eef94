"""What a data set module declares.

A data set is one class in one module of ``flower_pfl.experiment.datasets``: a dataclass whose fields are
its run-config keys (``flower_pfl.engine.params.param``, each starting with the data set's name or its
kind), whose class attributes describe it, and whose methods load it::

    @dataclass
    class CIFAR100(DataSet):
        '''CIFAR-100 (Krizhevsky 2009): ...'''
        name = "cifar100"
        kind = "image"
        hub = Hub("uoft-cs/cifar100", x="img", y="fine_label", splits=("train", "test"))
        labels: str = param("fine", key="cifar100-labels", must=one_of("fine", "coarse"), doc="...")

        def info(self): ...              # one sample's shape, the classes (no data loaded)
        def expected_files(self): ...    # what load_files reads, under data-dir
        def load_files(self, root, download): ...   # the local files: torchvision's layout or the archive's

``flower_pfl.experiment.datasets.registry`` finds it: the run config gains ``dataset = "cifar100"`` and
its keys. A data set gives its samples as a ``Pool`` (raw: uint8 images, strings, float signals); the
experiment partitions it over clients (``natural``: by the pool's groups; else a label scheme, within
each domain when the pool has domains), splits each client's share, and ``encoder`` turns the raw
samples into tensors (images to floats in [-1, 1]; a text's words to ids of a vocabulary fitted on the
clients' training parts).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from flower_pfl.engine.extras import require
from flower_pfl.engine.params import check_params
from flower_pfl.experiment.data.files import MissingFiles, located, require_files
from flower_pfl.experiment.data.hub import Hub, load_hub_columns
from flower_pfl.experiment.data.images import decode_images, read_images, to_float, torchvision_pool, torchvision_resized_pool
from flower_pfl.experiment.data.info import DataInfo
from flower_pfl.experiment.data.partition import SCHEMES

#: the run config's ``data-source`` values: local files, or the Hugging Face hub's files (through ``datasets``)
FILES, HUB = "torchvision", "huggingface"
DATA_SOURCES: tuple[str, ...] = (FILES, HUB)
#: old ``data-source`` values, still read (with a ``FutureWarning``) as the current ones
RENAMED_SOURCES: dict[str, str] = {"flwr-datasets": HUB}


@dataclass(frozen=True)
class Where:
    """Where a data set's files are: ``source`` (``FILES``: under ``data_dir``, in torchvision's layout or
    the data set's own; ``HUB``: the hub id, or ``hub_dataset``: another id or a local folder holding the
    hub's files), and whether torchvision may ``download`` the files."""

    source: str = FILES
    data_dir: str = "data"
    download: bool = False
    hub_dataset: str = ""


@dataclass
class Pool:
    """A data set's samples before they are partitioned: raw ``x`` (an array indexed by sample: uint8
    images, float signals, int64 ids, or objects such as strings), int64 labels ``y``, and optionally each
    sample's natural client (``groups``: writer, speaking role, subject) or domain (``domains``, the digit
    data set it comes from), and where the publisher splits it, which samples are its test part (``test``;
    a natural client's split then keeps the publisher's, as LEAF's train/test output)."""

    x: np.ndarray
    y: np.ndarray
    groups: np.ndarray | None = None
    domains: np.ndarray | None = None
    test: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.y = np.asarray(self.y, dtype=np.int64)
        for name in ("groups", "domains", "test"):
            value = getattr(self, name)
            if value is not None and len(value) != len(self.y):
                raise ValueError(f"the pool has {len(self.y)} labels and {len(value)} {name}")
        if len(self.x) != len(self.y):
            raise ValueError(f"the pool has {len(self.x)} samples and {len(self.y)} labels")

    def take(self, index: np.ndarray) -> Pool:
        pick = lambda a: None if a is None else a[index]
        return Pool(self.x[index], self.y[index], pick(self.groups), pick(self.domains), pick(self.test))

    @staticmethod
    def join(pools: Sequence[Pool]) -> Pool:
        """The pools' samples one after the other."""
        both = lambda name: None if any(getattr(p, name) is None for p in pools) else np.concatenate([getattr(p, name) for p in pools])
        return Pool(np.concatenate([p.x for p in pools]), np.concatenate([p.y for p in pools]), both("groups"), both("domains"),
                    both("test"))


Encoder = Callable[[np.ndarray], torch.Tensor]


@dataclass
class DataSet:
    """Class-level facts of a data set, and how it is loaded."""

    #: the run config's ``dataset`` value
    name: ClassVar[str]
    #: what one sample is (``flower_pfl.experiment.data.info.KINDS``)
    kind: ClassVar[str]
    #: what one natural client is ("writer", "speaking role", "subject", "user"): ``partition = "natural"``
    #: gives each client one (``""``: the data set has no natural clients)
    natural: ClassVar[str] = ""
    #: the label partitions that make sense for it
    schemes: ClassVar[tuple[str, ...]] = SCHEMES
    #: where the Hugging Face hub has it (``None``: nowhere)
    hub: ClassVar[Hub | None] = None
    #: it has local files (``load_files``)
    has_files: ClassVar[bool] = True
    #: ``True``: a client's test part follows its training part in time, ``split_gap`` samples later (LEAF's
    #: split of the overlapping windows of one text); ``False``: a seeded shuffle
    temporal_split: ClassVar[bool] = False
    split_gap: ClassVar[int] = 0
    #: where its figures come from, and the layout of its files, for the documentation
    files_text: ClassVar[str] = ""
    #: ``download = true`` fetches its files (torchvision's downloads); ``False``: they come from an archive
    #: the user unpacks under ``data-dir`` (``files_text`` says which)
    downloadable: ClassVar[bool] = False

    def __post_init__(self) -> None:
        check_params(self)

    # --- what a model needs to know -----------------------------------------------------------
    def info(self) -> DataInfo:
        """One sample's shape and kind and the number of classes, without loading anything."""
        raise NotImplementedError

    @classmethod
    def sources(cls) -> tuple[str, ...]:
        """The run config's ``data-source`` values it can be read from (a data set without files of its own
        reads the hub's files with either)."""
        return (FILES, HUB) if cls.hub is not None or not cls.has_files else (FILES,)

    def has_download(self) -> bool:
        """Whether ``download = true`` fetches every file this instance reads (by default: ``downloadable``)."""
        return self.downloadable

    @classmethod
    def partitions(cls) -> tuple[str, ...]:
        """The run config's ``partition`` values this data set takes."""
        return (("natural",) if cls.natural else ()) + cls.schemes

    # --- loading ----------------------------------------------------------------------------------
    def pool(self, where: Where, num_partitions: int, seed: int) -> Pool:
        """Every sample, from the local files or the hub as ``where`` says. The hub's files are read from
        ``hub-dataset``, else from ``<data-dir>/<hub id>`` where that folder exists (a download of them),
        else from the hub; a data set without files of its own reads them so with either source."""
        if where.source == FILES and self.has_files:
            return self.load_files(Path(where.data_dir), where.download)
        spec = self.hub_spec()
        if spec is None:
            raise ValueError(f"dataset {self.name!r} is not on the hub; use data-source = {FILES!r}")
        return self.from_hub(load_hub_columns(spec, self.hub_source(where)))

    def hub_spec(self) -> Hub | None:
        """Where the hub has this data set, with this instance's columns (default: the class's ``hub``)."""
        return self.hub

    def hub_source(self, where: Where) -> str:
        """Where the hub's files are read from: ``hub-dataset``, the local copy ``<data-dir>/<hub id>``, or the hub."""
        spec = self.hub_spec()
        assert spec is not None
        local = Path(where.data_dir) / spec.id
        return where.hub_dataset if where.source == HUB and where.hub_dataset else str(local) if local.is_dir() else spec.id

    def expected_files(self) -> list[str]:
        """The files (relative to ``data-dir``) ``load_files`` reads; for a data set without files of its own,
        the folder of the hub's files it reads."""
        spec = self.hub_spec()
        return [f"{spec.id}/ (a download of the hub's files)"] if not self.has_files and spec is not None else []

    def locate(self, root: Path) -> tuple[list[str], list[str]]:
        """Which of the files ``load_files`` reads are under ``root`` and which are missing, looked for and not read
        (``flower_pfl.experiment.data.files.located``; an entry of ``expected_files`` with a description is no file)."""
        return located(Path(root), [name for name in self.expected_files() if " (" not in name])

    def load_files(self, root: Path, download: bool) -> Pool:
        """Every sample, from the local files under ``root`` (``FileNotFoundError`` naming what is missing)."""
        raise NotImplementedError

    def from_hub(self, columns: Mapping[str, Sequence[Any]]) -> Pool:
        """Every sample, from the hub's columns (every split of ``hub.splits`` the source has, pooled). By
        default images: the ``x`` column decoded to uint8 ``(n, C, H, W)`` with this data set's channels."""
        spec = self.hub_spec()
        assert spec is not None
        groups = np.asarray(columns[spec.group], dtype=object) if spec.group else None
        return Pool(decode_images(columns[spec.x], self.info().input_shape), np.asarray(columns[spec.y]), groups)

    def encoder(self, train_parts: Sequence[np.ndarray]) -> Encoder:
        """What turns a client's raw samples into the model's input, fitted on every client's training part
        where it learns something (a vocabulary). By default: images to float32 in [-1, 1], anything else as
        float32."""
        if self.kind == "image":
            return lambda x: torch.as_tensor(to_float(x))
        return lambda x: torch.as_tensor(np.asarray(x, dtype=np.float32))

    @classmethod
    def summary(cls) -> str:
        """The docstring's first paragraph, on one line."""
        return " ".join(inspect.getdoc(cls).split("\n\n")[0].split())  # type: ignore[union-attr]


@dataclass
class TorchvisionImages(DataSet):
    """An image data set torchvision reads from its own files: its class ``torchvision_class`` (train and test
    parts pooled), the ``files`` it reads, one sample's ``shape`` and the number of ``classes``."""

    kind = "image"
    torchvision_class: ClassVar[str]
    files: ClassVar[tuple[str, ...]]
    shape: ClassVar[tuple[int, int, int]]
    classes: ClassVar[int] = 10

    def info(self) -> DataInfo:
        return DataInfo(self.shape, self.classes, self.kind)

    downloadable = True

    def expected_files(self) -> list[str]:
        return list(self.files)

    def load_files(self, root: Path, download: bool) -> Pool:
        self.require(root, download)
        return Pool(*torchvision_pool(self.torchvision_class, root, download, self.name))

    def require(self, root: Path, download: bool) -> None:
        """Without ``download``: every expected file there (a publisher's ``.gz`` unpacked next to it), or
        ``MissingFiles`` naming what was found and what is missing (``flower_pfl.experiment.data.files``)."""
        require("torchvision", why=f"dataset = {self.name!r}")  # the missing extra first: files alone would not do
        if not download:
            require_files(root, self.expected_files())


@dataclass
class ResizedTorchvisionImages(DataSet):
    """A colour image data set of many image sizes that torchvision reads from its own files, by ``split``: its
    class ``torchvision_class``, the ``parts`` pooled, the ``files`` it reads (patterns), the number of
    ``classes``; every image resized to ``SIDE`` x ``SIDE`` as FL-bench does
    (``flower_pfl.experiment.data.images.torchvision_resized_pool``)."""

    #: the side the images are resized to (FL-bench's 32 x 32)
    SIDE: ClassVar[int] = 32
    kind = "image"
    downloadable = True
    torchvision_class: ClassVar[str]
    parts: ClassVar[tuple[str, ...]]
    files: ClassVar[tuple[str, ...]]
    classes: ClassVar[int]
    #: a package torchvision needs to read its files besides itself (scipy for ``.mat`` files; ``""``: none)
    needs: ClassVar[str] = ""

    def info(self) -> DataInfo:
        return DataInfo((3, self.SIDE, self.SIDE), self.classes, self.kind)

    def expected_files(self) -> list[str]:
        return list(self.files)

    def load_files(self, root: Path, download: bool) -> Pool:
        """Without a download (or where there is none): every expected file there, else ``MissingFiles``."""
        if self.needs:
            require(self.needs, why=f"dataset = {self.name!r}")
        download = download and self.downloadable
        if not download:
            require_files(root, self.expected_files())
        return Pool(*torchvision_resized_pool(self.torchvision_class, root, download, self.name, self.parts, self.SIDE))


@dataclass
class ClassFolders(DataSet):
    """An image data set shipped as one folder of images per class: ``<folder>/<part>/<class>/*`` for each of
    ``parts`` (``""``: the class folders straight under ``folder``), its classes ``class_names`` in label order;
    every part's images pooled, read in colour and resized to ``side`` x ``side`` (bilinear). With
    ``parts_are_domains`` each part is a domain (the pool's ``domains``), and ``chosen_parts`` may take some."""

    kind = "image"
    folder: ClassVar[str]
    parts: ClassVar[tuple[str, ...]] = ("",)
    class_names: ClassVar[tuple[str, ...]]
    side: ClassVar[int]
    #: the image files' name endings, as the archive has them
    suffixes: ClassVar[tuple[str, ...]] = (".jpg",)
    parts_are_domains: ClassVar[bool] = False

    def info(self) -> DataInfo:
        return DataInfo((3, self.side, self.side), len(self.class_names), self.kind)

    def chosen_parts(self) -> tuple[str, ...]:
        return self.parts

    def class_folder(self, part: str, name: str) -> str:
        return "/".join(p for p in (self.folder, part, name) if p)

    def expected_files(self) -> list[str]:
        return [f"{self.class_folder(part, '<class>')}/*{self.suffixes[0]}" for part in self.chosen_parts()]

    def load_files(self, root: Path, download: bool) -> Pool:
        """Every class folder must be there (one may be empty); ``MissingFiles`` names those that are not."""
        require_files(root, self.expected_files())
        folders = [(part, label, self.class_folder(part, name)) for part in self.chosen_parts() for label, name in enumerate(self.class_names)]
        if missing := [f"{folder}/" for _, _, folder in folders if not (Path(root) / folder).is_dir()]:
            raise MissingFiles(Path(root), self.expected_files(), missing)
        paths: list[Path] = []
        labels: list[int] = []
        domains: list[str] = []
        for part, label, folder in folders:
            files = sorted(p for p in (Path(root) / folder).iterdir() if p.suffix.lower() in self.suffixes)
            paths += files
            labels += [label] * len(files)
            domains += [part] * len(files)
        return Pool(read_images(paths, self.side), np.asarray(labels),
                    domains=np.asarray(domains, dtype=object) if self.parts_are_domains else None)
