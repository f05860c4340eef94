"""A ``RecordDict``'s records of one kind, read without copying.

Flower's ``RecordDict.metric_records`` (and ``array_records``, ``config_records``) builds a new checked view
of the records on every access, each entry type-checked twice; a round's server reads every reply's records,
a node every instruction's. These read the same records as plain dictionaries.
"""

from __future__ import annotations

from typing import Any, TypeVar

from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict

R = TypeVar("R", ArrayRecord, ConfigRecord, MetricRecord)


def records(content: RecordDict, kind: type[R]) -> dict[str, R]:
    """``content``'s records of ``kind``, by name (what ``content.metric_records`` and the like hold)."""
    return {name: record for name, record in content.items() if isinstance(record, kind)}


def merged(content: RecordDict, kind: type[ConfigRecord | MetricRecord]) -> dict[str, Any]:
    """The entries of every record of ``kind`` in ``content``, together (a later record's entry wins)."""
    return {k: v for record in content.values() if isinstance(record, kind) for k, v in record.items()}
