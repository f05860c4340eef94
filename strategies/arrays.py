"""Flower's ``Array`` to and from NumPy, fast: how the strategies, the ServerApp and the ClientApp
read and write a message's arrays."""

from __future__ import annotations

import io
from collections.abc import Mapping
from functools import lru_cache

import numpy as np
from flwr.app import Array, ArrayRecord

#: the start of the ``.npy`` bytes a Flower ``Array`` of stype ``numpy.ndarray`` holds (format 1.0)
_NPY_V1 = b"\x93NUMPY\x01\x00"


def array_numpy(array: Array) -> np.ndarray:
    """``array.numpy()``, without its parse of the ``.npy`` header by ``ast.literal_eval`` (a tenth of a
    millisecond an array, the most of a small model's decoding): Flower's ``Array`` holds ``np.save``'s
    bytes beside its dtype and shape, so a C-ordered array in format 1.0 is read from its data directly;
    anything else (or anything malformed) goes through ``array.numpy()``, which says what is wrong."""
    data = array.data
    if array.stype == "numpy.ndarray" and isinstance(data, bytes) and data[:8] == _NPY_V1:
        end = 10 + int.from_bytes(data[8:10], "little")
        if b"'fortran_order': False" in data[10:end]:
            try:
                dtype = np.dtype(array.dtype)
                count = int(np.prod(array.shape))
                if len(data) - end == count * dtype.itemsize and dtype.byteorder in "=|<":
                    return np.frombuffer(data, dtype=dtype, count=count, offset=end).reshape(array.shape).copy()
            except (TypeError, ValueError):
                pass
    return array.numpy()


def record_numpy(record: Mapping[str, Array]) -> dict[str, np.ndarray]:
    """An ``ArrayRecord``'s arrays as NumPy, by name (``array_numpy``)."""
    return {name: array_numpy(array) for name, array in record.items()}


@lru_cache(maxsize=1024)
def _npy_header(descr: str, shape: tuple[int, ...]) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": descr, "fortran_order": False, "shape": shape})
    return buffer.getvalue()


def numpy_array(a: np.ndarray) -> Array:
    """``Array(a)``: the same dtype, shape and ``np.save`` bytes, with the ``.npy`` header made once per
    dtype and shape (``np.save`` writes it through a buffer every time: most of a small array's cost).
    Arrays that are not C-contiguous, of object or structured dtypes, or with a header too long for
    format 1.0 go through ``Array(a)``."""
    if not a.flags.c_contiguous or a.dtype.hasobject or a.dtype.fields is not None:
        return Array(a)
    descr = np.lib.format.dtype_to_descr(a.dtype)
    if not isinstance(descr, str):
        return Array(a)
    try:
        header = _npy_header(descr, tuple(a.shape))
    except ValueError:  # too long for format 1.0: np.save writes another
        return Array(a)
    return Array(dtype=str(a.dtype), shape=tuple(a.shape), stype="numpy.ndarray", data=header + a.tobytes())


def numpy_record(arrays: Mapping[str, np.ndarray]) -> ArrayRecord:
    """An ``ArrayRecord`` of NumPy arrays by name (``numpy_array``)."""
    return array_record({name: numpy_array(a) for name, a in arrays.items()})


def array_record(arrays: Mapping[str, Array]) -> ArrayRecord:
    """An ``ArrayRecord`` holding ``arrays`` themselves: ``ArrayRecord(arrays)`` makes a new ``Array`` of each (a
    quarter of the time; an ``Array``'s bytes cannot change, so records may share one)."""
    record = ArrayRecord()
    for name, array in arrays.items():
        record[name] = array
    return record

