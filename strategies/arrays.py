"""Flower's ``Array`` to and from NumPy, fast: how the strategies, the ServerApp and the ClientApp
read and write a message's arrays."""

from __future__ import annotations

import io
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord

from strategies.records import filled

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
        try:
            layout = _npy_layout(data[10:end], array.dtype, tuple(array.shape))
        except TypeError:  # a dtype or shape that cannot be a key: array.numpy() says what is wrong
            layout = None
        if layout is not None and len(data) - end == layout[1] * layout[0].itemsize:
            return np.frombuffer(data, dtype=layout[0], count=layout[1], offset=end).reshape(array.shape).copy()
    return array.numpy()


@lru_cache(maxsize=1024)
def _npy_layout(header: bytes, dtype: str, shape: tuple[int, ...]) -> tuple[np.dtype, int] | None:
    """The dtype and element count of a C-ordered little-endian ``.npy`` array with ``header`` (``None``: not one)."""
    if b"'fortran_order': False" not in header:
        return None
    try:
        kind = np.dtype(dtype)
        count = int(np.prod(shape))
    except (TypeError, ValueError):
        return None
    return (kind, count) if kind.byteorder in "=|<" else None


class DecodedArray(Array):
    """A received ``Array`` with what it decodes to: ``numpy()`` returns a copy of that instead of reading the
    bytes again (Flower's own strategies read every reply's arrays with ``np.load``, some 50 µs each, after the
    ServerApp's checks have read them). It lives in the server's own copy of a reply, which is never sent on
    (Flower names a sent object's type by its class), and is equal to the ``Array`` it stands for."""

    _value: np.ndarray

    @classmethod
    def of(cls, array: Array, value: np.ndarray) -> DecodedArray:
        """``array`` holding ``value``, what it decodes to (its fields taken as they are: ``Array()`` would
        check and copy them, several times the cost of the rest)."""
        made = cls.__new__(cls)
        made.__dict__.update(vars(array))
        value.flags.writeable = False  # a copy is handed out, so what it holds stays what was received
        made._value = value
        return made

    def numpy(self) -> np.ndarray:
        return self._value.copy()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Array):
            return NotImplemented
        return (self.dtype, self.shape, self.stype, self.data) == (other.dtype, other.shape, other.stype, other.data)

    __hash__ = None  # type: ignore[assignment]  # as Flower's ``Array``


def record_numpy(record: Mapping[str, Array]) -> dict[str, np.ndarray]:
    """An ``ArrayRecord``'s arrays as NumPy, by name (``array_numpy``)."""
    return {name: array_numpy(array) for name, array in record.items()}


@lru_cache(maxsize=1024)
def _npy_start(dtype: np.dtype, shape: tuple[int, ...]) -> tuple[bytes, dict[str, Any]] | None:
    """The ``.npy`` header (format 1.0) of a C-ordered array of ``dtype`` and ``shape``, and the fields of an
    ``Array`` of it but its data; ``None`` where ``np.save`` would write another format (a header too long for
    1.0, a dtype without a plain description)."""
    descr = np.lib.format.dtype_to_descr(dtype)
    if not isinstance(descr, str):
        return None
    buffer = io.BytesIO()
    try:
        np.lib.format.write_array_header_1_0(buffer, {"descr": descr, "fortran_order": False, "shape": shape})
    except ValueError:  # too long for format 1.0
        return None
    return buffer.getvalue(), vars(Array(dtype=str(dtype), shape=shape, stype="numpy.ndarray", data=b""))


def numpy_array(a: np.ndarray) -> Array:
    """``Array(a)``: the same dtype, shape and ``np.save`` bytes, with the ``.npy`` header and the ``Array``'s
    checked fields made once per dtype and shape (``np.save`` writes the header through a buffer every time,
    and ``Array()`` checks its arguments every time: most of a small array's cost). Arrays that are not
    C-contiguous, of object or structured dtypes, or whose header is not format 1.0's go through ``Array(a)``."""
    if not a.flags.c_contiguous or a.dtype.hasobject or a.dtype.fields is not None:
        return Array(a)
    start = _npy_start(a.dtype, a.shape)
    if start is None:
        return Array(a)
    made = Array.__new__(Array)
    made.__dict__.update(start[1])
    made.__dict__["data"] = start[0] + a.tobytes()
    return made


def numpy_record(arrays: Mapping[str, np.ndarray]) -> ArrayRecord:
    """An ``ArrayRecord`` of NumPy arrays by name (``numpy_array``)."""
    return array_record({name: numpy_array(a) for name, a in arrays.items()})


def array_record(arrays: Mapping[str, Array]) -> ArrayRecord:
    """An ``ArrayRecord`` holding ``arrays`` themselves: ``ArrayRecord(arrays)`` makes a new ``Array`` of each (a
    quarter of the time; an ``Array``'s bytes cannot change, so records may share one)."""
    return put_arrays(ArrayRecord(), arrays)


def put_arrays(record: ArrayRecord, arrays: Mapping[str, Array]) -> ArrayRecord:
    """``record[name] = array`` for each of ``arrays``, with Flower's check of each entry (a tenth of the rest of
    the cost: ``strategies.records``) made once for all; ``record``."""
    if all(type(name) is str and isinstance(array, Array) for name, array in arrays.items()):
        filled(record, arrays).is_dirty = True  # as Flower's setting of an entry marks it
        return record
    for name, array in arrays.items():
        record[name] = array  # Flower's check says what is wrong
    return record
