"""A message's arrays to and from NumPy (``strategies/arrays.py``): the fast paths give exactly what
Flower's own ``Array(ndarray)`` and ``Array.numpy()`` give, and whatever they do not handle goes
through Flower's."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord

from strategies.arrays import DecodedArray, array_numpy, array_record, numpy_array, numpy_record, record_numpy

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
    assert type(ours) is Array and vars(ours) == vars(flowers)  # every field Flower's own would hold, no more
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


def test_a_shape_that_cannot_be_read_goes_to_flowers_own_reader():
    good = numpy_array(ARRAYS["matrix"])
    odd = Array(dtype=good.dtype, shape=tuple(good.shape), stype=good.stype, data=good.data)
    odd.shape = [[10], [60]]  # type: ignore[assignment]  # what a hostile reply's decoded metadata may hold
    assert np.array_equal(array_numpy(odd), odd.numpy())  # Flower's reader: the .npy header's shape


def test_a_decoded_array_is_the_array_it_stands_for_and_hands_out_copies():
    a = ARRAYS["matrix"]
    plain = numpy_array(a)
    kept = DecodedArray.of(plain, array_numpy(plain))
    assert kept == plain and plain == kept and not kept != plain  # either way round, as two equal Arrays
    assert kept != numpy_array(a + 1) and (kept.dtype, kept.shape, kept.stype, kept.data) == (plain.dtype, plain.shape, plain.stype, plain.data)
    first = kept.numpy()
    assert np.array_equal(first, plain.numpy()) and first.dtype == a.dtype and first.flags.writeable
    first[:] = -1  # a reader that writes into what it got changes nothing the next reader gets
    assert np.array_equal(kept.numpy(), a)


# --- a round's instruction models made into arrays, each array once ------------------------------------------------

import torch  # noqa: E402

from flower_pfl.engine.layout import ParamLayout  # noqa: E402
from flower_pfl.engine.method_server import MethodServer  # noqa: E402
from flower_pfl.engine.wire import RoundArrays  # noqa: E402
from flower_pfl.methods.fedper import FedPer  # noqa: E402

SHAPES = {"fc1.weight": (2, 3), "fc1.bias": (2,), "fc2.weight": (2, 2), "fc2.bias": (2,)}


def test_a_model_sent_twice_and_tensors_equal_to_the_first_are_made_once():
    layout = ParamLayout.from_arrays({k: np.zeros(s, np.float32) for k, s in SHAPES.items()})
    made = RoundArrays(layout, common={0, 1}, encode=numpy_array)
    first, second = torch.zeros(14), torch.zeros(14)
    second[8:] = 1.0  # fc2 differs, fc1 as in the first
    a, b = made(first), made(second)
    assert made(second) is b  # the same model again: the same arrays
    assert a[0] is b[0] and a[1] is b[1] and a[2] is not b[2]  # fc1 (common) once, fc2 each its own
    other = second.clone()
    other[0] = 5.0  # a common tensor that differs after all: an array of its own
    c = made(other)
    assert c[0] is not a[0] and np.array_equal(array_numpy(c[0]), other[:6].reshape(2, 3).numpy())
    assert all(np.array_equal(array_numpy(x), second[s].reshape(SHAPES[n]).numpy())
               for x, s, n in zip(b, layout.tensor_slices(), SHAPES))


def test_fedpers_evaluation_messages_share_the_base_and_are_made_a_chunk_at_a_time(monkeypatch):
    """Every client's evaluation model is the base and its own head: the base's arrays are made once, and the
    instructions are made ``CHUNK_BYTES`` of models at a time, the same instructions either way."""
    import flower_pfl.engine.method_server as ms

    server = MethodServer(FedPer(), clients_per_round=2)
    server.initialize({k: np.full(s, 0.5, np.float32) for k, s in SHAPES.items()})
    whole = server.plan_evaluation(1, list(range(10)), 1.0)
    calls = []
    evaluation_instructions = server.method.evaluation_instructions
    monkeypatch.setattr(server.method, "evaluation_instructions",
                        lambda r, ids: calls.append(list(ids)) or evaluation_instructions(r, ids))
    monkeypatch.setattr(ms, "CHUNK_BYTES", 4 * 14 * 4)  # four clients' models
    chunked = list(server.evaluation_plan(1, list(range(10)), 1.0))
    assert calls == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert [i.client_id for i in chunked] == [i.client_id for i in whole]
    assert all(torch.equal(a.model, b.model) for a, b in zip(chunked, whole))
    made = server.round_arrays(numpy_array)
    arrays = [made(ins.model) for ins in chunked]
    assert server.method.common_tensors() == frozenset({0, 1})  # fc1, the base
    assert all(a[0] is arrays[0][0] and a[1] is arrays[0][1] for a in arrays)


def test_a_record_holds_the_arrays_given_as_flowers_does_and_refuses_what_flower_refuses():
    arrays = {"w": numpy_array(np.ones((2, 2), np.float32)), "b": numpy_array(np.zeros(2, np.float32))}
    ours, flowers = array_record(arrays), ArrayRecord()
    for name, array in arrays.items():
        flowers[name] = array
    assert ours == flowers and list(ours) == ["w", "b"] and all(ours[n] is a for n, a in arrays.items())
    assert vars(ours).keys() == vars(flowers).keys() and ours.is_dirty
    with pytest.raises(TypeError):
        array_record({"w": np.ones(2)})  # an ndarray, not an Array
