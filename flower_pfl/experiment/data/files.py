"""A data set's files as their publishers ship them: found or missing, each by name, compressed or not.

LeCun's MNIST, Zalando's Fashion-MNIST and EMNIST ship their idx files gzipped (``*-ubyte.gz``), and
torchvision reads them unpacked. ``require_files`` finds each expected file under ``data-dir``, unpacks
a ``.gz`` found in its place next to it (as torchvision's own download does), checks the idx files'
headers, and raises ``MissingFiles`` naming exactly what was found and what is missing.
"""

from __future__ import annotations

import gzip
import math
import os
import re
import shutil
import struct
import tempfile
from collections.abc import Sequence
from pathlib import Path

#: idx magic numbers of unsigned bytes: the dimensions an images (3) or labels (1) file has
_IDX_UBYTE = 0x08


class MissingFiles(FileNotFoundError):
    """Expected files that are not under ``root``: which were found and which are missing."""

    def __init__(self, root: Path, found: Sequence[str], missing: Sequence[str]) -> None:
        self.root, self.found, self.missing = Path(root), list(found), list(missing)
        gz = [m for m in missing if m.endswith("-ubyte")]
        also = " (each also read as the publisher's .gz)" if gz else ""
        #: what was found and what is missing, without the folder
        self.detail = (f"found {', '.join(found)}; " if found else "") + f"missing {', '.join(missing)}{also}"
        super().__init__(f"under {self.root}: {self.detail}")


class MalformedFile(ValueError):
    """A data file that is there but cannot be read, and why."""


def located(root: Path, expected: Sequence[str]) -> tuple[list[str], list[str]]:
    """Which of ``expected`` (relative to ``root``) are there and which are missing: a file counts when it or its
    publisher's ``<file>.gz`` is; a pattern (``*``, or ``<name>`` for any part) needs one match."""
    found: list[str] = []
    missing: list[str] = []
    for name in expected:
        pattern = re.sub(r"<[^>]*>", "*", name)
        path = root / name
        there = any(root.glob(pattern)) if "*" in pattern else path.is_file() or Path(f"{path}.gz").is_file()
        (found if there else missing).append(name)
    return found, missing


def require_files(root: Path, expected: Sequence[str]) -> None:
    """Every file of ``expected`` (paths relative to ``root``) is there, unpacked from ``<file>.gz`` where only
    that is; ``MissingFiles`` names what was found and what is missing, ``MalformedFile`` an idx file whose
    header does not match its size."""
    root = Path(root)
    found, missing = located(root, expected)
    if missing:
        raise MissingFiles(root, found, missing)
    for name in expected:
        path = root / name
        if not path.is_file() and Path(f"{path}.gz").is_file():
            gunzip(Path(f"{path}.gz"), path)
        if name.endswith("-ubyte"):
            check_idx(path)


def require_listed(root: Path, lists: Sequence[str], paths: Sequence[Path]) -> None:
    """Every file ``paths`` that the list files ``lists`` (found, relative to ``root``) name is there; else
    ``MissingFiles`` naming the first five missing and how many more."""
    if missing := [p for p in paths if not p.is_file()]:
        names = [str(p.relative_to(root)) for p in missing[:5]]
        raise MissingFiles(Path(root), lists, names + ([f"and {len(missing) - 5} more files the lists name"] if len(missing) > 5 else []))


def gunzip(source: Path, target: Path) -> None:
    """``source`` (gzip) unpacked into ``target``, atomically: a reader never sees half a file."""
    handle, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(handle, "wb") as out, gzip.open(source, "rb") as packed:
            shutil.copyfileobj(packed, out)
        os.replace(temp, target)
    except (OSError, EOFError) as err:
        Path(temp).unlink(missing_ok=True)
        raise MalformedFile(f"{source}: not a gzip file this could unpack ({err})") from err


def check_idx(path: Path) -> None:
    """``MalformedFile`` unless ``path`` is an idx file of unsigned bytes whose size matches its header."""
    size = path.stat().st_size
    with path.open("rb") as fh:
        head = fh.read(4)
        if len(head) < 4 or head[:2] != b"\x00\x00" or head[2] != _IDX_UBYTE or head[3] not in (1, 3):
            raise MalformedFile(f"{path}: not an idx file of unsigned bytes (its first bytes are {head.hex() or 'missing'}; "
                                "an idx file starts 0x00000801 for labels or 0x00000803 for images)")
        header = fh.read(4 * head[3])
    if len(header) < 4 * head[3]:
        raise MalformedFile(f"{path}: its idx header is cut short ({size} bytes in all)")
    dims = struct.unpack(f">{head[3]}I", header)
    expected = 4 + 4 * len(dims) + math.prod(dims)
    if size != expected:
        raise MalformedFile(f"{path}: its header says {' x '.join(map(str, dims))} bytes of data ({expected} bytes in all) "
                            f"but the file has {size}: truncated or not this data set's file")
