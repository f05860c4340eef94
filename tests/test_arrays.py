"""A message's arrays to and from NumPy (``strategies/arrays.py``): the fast paths give exactly what
Flower's own ``Array(ndarray)`` and ``Array.numpy()`` give, and whatever they do not handle goes
through Flower's."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array

from strategies.arrays import array_numpy, numpy_array, numpy_record, record_numpy

ARRAYS = {
    "matrix": np.arange(600, dtype=np.float32).reshape(10, 60) / 7,
    "vector": np.arange(5),
    "empty": np.zeros((0, 3), np.float32),
    "scalar": np.array(3.5, dtype=np.float32),
    "fortran": np.asfortranarray(np.arange(12.0).reshape(3, 4)),
    "strided": np.arange(12.0).reshape(3, 4)[:, ::2],
    "bool": np.array([True, False]),
    "big-endian": np.arange(3, dtype=">f4"),
    "half": np.ones((2, 2), np.float16),
    "many-dims": np.zeros((1,) * 30),
    "structured": np.zeros(2, dtype=[("a", "<i4"), ("b", "<f8")]),
}


@pytest.mark.parametrize("name", list(ARRAYS))
def test_an_array_is_what_flower_makes_of_it_and_reads_back(name):
    a = ARRAYS[name]
    ours, flowers = numpy_array(a), Array(a)
    assert (ours.dtype, tuple(ours.shape), ours.stype, ours.data) == (flowers.dtype, tuple(flowers.shape), flowers.stype, flowers.data)
    back = array_numpy(ours)
    assert back.dtype == a.dtype and back.shape == a.shape and np.array_equal(back, a)
    assert back.flags.writeable  # a copy, not a view of the message's bytes


def test_a_record_round_trips_by_name():
    record = numpy_record({k: ARRAYS[k] for k in ("matrix", "scalar", "vector")})
    assert list(record.keys()) == ["matrix", "scalar", "vector"]
    assert all(np.array_equal(v, ARRAYS[k]) for k, v in record_numpy(record).items())


def test_malformed_bytes_are_refused_by_flowers_own_reader():
    good = numpy_array(ARRAYS["matrix"])
    short = Array(dtype=good.dtype, shape=tuple(good.shape), stype=good.stype, data=good.data[:-4])
    with pytest.raises(ValueError):
        array_numpy(short)
