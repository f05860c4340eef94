"""The bytes a message carries, as the rounds' cost counts them (``flower_pfl.run.cost``).

A message's bytes are its payload: each array's ``Array.data`` (NumPy's ``.npy`` bytes: the values and a
header of about 128 bytes), and each config or metric value (bytes and strings by their length, a number
8 bytes, a bool 1, a list its items). Record and key names and Flower's protobuf framing are left out;
they add a few bytes an entry. A legacy instruction or result counts the same parts: its parameters'
tensors, its config or metrics, and its loss and sample count as numbers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from flwr.app import ArrayRecord, RecordDict
from flwr.common import Parameters

#: the exact types of the numbers a value counts 8 bytes for (``bool``, a subclass of ``int``, counts 1)
_NUMBERS = frozenset({int, float})


def value_bytes(value: Any) -> int:
    """The payload of one config or metric value."""
    if type(value) in _NUMBERS:  # most values: checked first
        return 8
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, bool):
        return 1
    if isinstance(value, (list, tuple)):
        return sum(value_bytes(v) for v in value)
    return 8


def record_bytes(record: Any) -> int:
    """The payload of one record: an ``ArrayRecord``'s arrays' data, a config or metric record's values."""
    if isinstance(record, ArrayRecord):
        return sum(len(array.data) for array in record.values())
    return sum(value_bytes(v) for v in record.values())


def content_bytes(content: RecordDict, sizes: dict[int, int] | None = None) -> int:
    """The payload of a message's ``content``, every record counted (a record several messages share is
    counted in each). ``sizes``: the records' sizes by ``id``, kept across the calls of one round."""
    total = 0
    for _, record in content.items():
        if sizes is None:
            total += record_bytes(record)
        elif (size := sizes.get(id(record))) is not None:
            total += size
        else:
            total += sizes.setdefault(id(record), record_bytes(record))
    return total


def legacy_bytes(parameters: Parameters | None, values: Mapping[str, Any], numbers: int = 0) -> int:
    """The payload of a legacy instruction or result: its ``parameters``' tensors, its config or metrics
    ``values`` and ``numbers`` further numbers (a result's loss and sample count)."""
    tensors: Iterable[bytes] = parameters.tensors if parameters is not None else ()
    return sum(len(t) for t in tensors) + sum(value_bytes(v) for v in values.values()) + 8 * numbers
