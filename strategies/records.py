"""Flower's records, read without copying and made with their checks done once per value.

Flower's ``RecordDict.metric_records`` (and ``array_records``, ``config_records``) builds a new checked view
of the records on every access, each entry type-checked twice; a round's server reads every reply's records,
a node every instruction's. ``records`` and ``merged`` read the same records as plain dictionaries.

Flower's record constructors check each entry through typing lookups (``get_args``, a new ``Callable[...]``
per entry): some 5 µs a value, most of the cost of a client's reply. ``metric_record``, ``config_record`` and
``record_dict`` make the same records, checking each value's exact type against what Flower accepts; anything
else goes through Flower's own constructor, which accepts it or says what is wrong. ``filled`` adds entries
unchecked, where they were checked already (a copy of a record). ``entries`` is the one place that knows where
Flower's records keep their entries.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict

R = TypeVar("R", ArrayRecord, ConfigRecord, MetricRecord)
T = TypeVar("T", RecordDict, ConfigRecord, MetricRecord, ArrayRecord)
#: the exact types of the values Flower's records take, and of the items of their lists (``bool`` is no metric)
_METRIC_TYPES = frozenset({int, float})
_CONFIG_TYPES = frozenset({int, float, str, bytes, bool})
_RECORD_TYPES = frozenset({ArrayRecord, ConfigRecord, MetricRecord})


def records(content: RecordDict, kind: type[R]) -> dict[str, R]:
    """``content``'s records of ``kind``, by name (what ``content.metric_records`` and the like hold)."""
    return {name: record for name, record in content.items() if isinstance(record, kind)}


def merged(content: RecordDict, kind: type[ConfigRecord | MetricRecord]) -> dict[str, Any]:
    """The entries of every record of ``kind`` in ``content``, together (a later record's entry wins)."""
    return {k: v for record in content.values() if isinstance(record, kind) for k, v in record.items()}


def metric_record(values: Mapping[str, Any]) -> MetricRecord:
    """``MetricRecord(values)``."""
    return _made(MetricRecord, values, _METRIC_TYPES)


def config_record(values: Mapping[str, Any]) -> ConfigRecord:
    """``ConfigRecord(values)``."""
    return _made(ConfigRecord, values, _CONFIG_TYPES)


def record_dict(values: Mapping[str, ArrayRecord | ConfigRecord | MetricRecord]) -> RecordDict:
    """``RecordDict(values)``."""
    if all(type(k) is str and type(v) in _RECORD_TYPES for k, v in values.items()):
        return filled(RecordDict(), values)
    return RecordDict(dict(values))


def _made(kind: type[T], values: Mapping[str, Any], scalars: frozenset[type]) -> T:
    for key, value in values.items():
        if type(key) is not str or not (type(value) in scalars or (type(value) is list and _listed(value, scalars))):
            return kind(dict(values))
    return filled(kind(), values)


def _listed(values: list[Any], scalars: frozenset[type]) -> bool:
    """A list Flower takes: empty, or of one of ``scalars`` throughout."""
    return not values or (type(values[0]) in scalars and all(type(v) is type(values[0]) for v in values))


def filled(record: T, values: Mapping[str, Any]) -> T:
    """``record`` with ``values`` added unchecked: values already checked, or taken from a record of its kind."""
    entries(record).update(values)
    return record


def entries(record: ArrayRecord | ConfigRecord | MetricRecord | RecordDict) -> dict[str, Any]:
    """The dictionary a record keeps its entries in (Flower's ``TypedDict._data``; the tests compare every record
    made through it with Flower's own): set directly, its entries skip Flower's check of each."""
    return vars(record)["_data"]
