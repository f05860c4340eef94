"""One message for a node's clients: the records of several clients' messages in one ``RecordDict``.

A node may host several clients (run config ``num-clients``; ``client_apps.hosting``). The server
then sends each node one message per round and phase holding the instructions of that node's
sampled clients, and the node replies with one message holding each client's reply
(``server_apps.client_grid`` on the server, ``client_apps.app`` on the node). A pack is a
``RecordDict`` with

- ``PACK`` (a ``ConfigRecord``): ``"clients"``, the clients' ids in order, and per client
  ``"<id>.names"`` / ``"<id>.records"``, the names its message gives its records and where they lie;
- the records themselves under ``"pfl.<k>"``, each stored once however many clients share it
  (FedAvg's clients all receive the one global model);
- in a reply, ``ERRORS`` (a ``ConfigRecord``): the reason of each client that failed, by id, and
  ``REPORT``: how the node trained and evaluated its clients (``Tally``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from strategies.records import config_record, record_dict

#: the pack's table of contents
PACK = "pfl.pack"
#: a reply pack's failed clients: reason by client id
ERRORS = "pfl.errors"
#: a reply pack's account of how the node ran its clients (``Tally.record``)
REPORT = "pfl.report"
_RECORD = "pfl.{}"

Record = ArrayRecord | ConfigRecord | MetricRecord


def is_pack(content: RecordDict) -> bool:
    """Whether ``content`` is a pack (well formed or not: ``unpack`` says)."""
    return PACK in content  # not ``content.config_records``: it copies every record


def pack(contents: Mapping[int, RecordDict], errors: Mapping[int, str] | None = None,
         report: ConfigRecord | None = None) -> RecordDict:
    """One ``RecordDict`` holding each client's ``contents`` (by client id), the reasons of the clients in
    ``errors`` and the node's ``report``; a record several clients hold (the same object) is stored once."""
    table: dict[str, Any] = {"clients": [int(c) for c in contents]}
    out: dict[str, Record] = {}
    stored: dict[int, int] = {}
    for client, content in contents.items():
        names, places = [], []
        for name, record in content.items():
            if (place := stored.get(id(record))) is None:
                place = stored[id(record)] = len(stored)
                out[_RECORD.format(place)] = record
            names.append(name)
            places.append(place)
        table[f"{client}.names"], table[f"{client}.records"] = names, places
    out[PACK] = config_record(table)
    if errors:
        out[ERRORS] = config_record({str(c): str(why) for c, why in errors.items()})
    if report is not None:
        out[REPORT] = report
    return record_dict(out)


def unpack(content: RecordDict) -> tuple[dict[int, RecordDict], dict[int, str]]:
    """Each client's ``RecordDict`` by client id, and the reasons of the clients that failed; ``ValueError``
    for a pack whose table of contents does not match its records."""
    table = content[PACK]
    if not isinstance(table, ConfigRecord):
        raise ValueError(f"malformed pack: {PACK!r} is a {type(table).__name__}, not a ConfigRecord")
    contents: dict[int, RecordDict] = {}
    for client in _ids(table.get("clients", [])):
        names, places = _entries(table, f"{client}.names"), _entries(table, f"{client}.records")
        if len(names) != len(places):
            raise ValueError(f"malformed pack: client {client} has {len(names)} record names and {len(places)} records")
        try:
            contents[client] = record_dict({str(n): content[_RECORD.format(int(p))] for n, p in zip(names, places)})
        except KeyError as err:
            raise ValueError(f"malformed pack: client {client}'s record {err} is missing") from None
        except (TypeError, ValueError) as err:  # a place that is not a number; a record of no record type
            raise ValueError(f"malformed pack: client {client}'s records: {err}") from None
    errors = content.get(ERRORS, ConfigRecord())
    if not isinstance(errors, ConfigRecord):
        raise ValueError(f"malformed pack: {ERRORS!r} is a {type(errors).__name__}, not a ConfigRecord")
    try:
        return contents, {int(c): str(why) for c, why in errors.items()}
    except ValueError:
        raise ValueError(f"malformed pack: {ERRORS!r} names clients that are not client ids: {list(errors)[:5]}") from None


def _ids(values: Any) -> list[int]:
    if not isinstance(values, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ValueError(f"malformed pack: 'clients' must be a list of client ids, got {values!r}")
    return [int(v) for v in values]


def _entries(table: ConfigRecord, key: str) -> list[Any]:
    value = table.get(key, [])
    return list(value) if isinstance(value, list) else [value]


@dataclass
class Tally:
    """How a node's or a run's messages of one phase were answered: with their round's clients as one
    computation, one by one, and the reasons (clients by reason)."""

    together: int = 0
    one_by_one: int = 0
    reasons: dict[str, int] = field(default_factory=dict)

    def apart(self, why: str, clients: int = 1) -> None:
        """``clients`` answered one by one because of ``why``."""
        self.one_by_one += clients
        self.reasons[why] = self.reasons.get(why, 0) + clients

    def add(self, other: Tally) -> None:
        self.together += other.together
        self.one_by_one += other.one_by_one
        for why, n in other.reasons.items():
            self.reasons[why] = self.reasons.get(why, 0) + n

    def record(self) -> ConfigRecord:
        """This tally in a reply pack (``REPORT``)."""
        return ConfigRecord({"together": self.together, "one-by-one": self.one_by_one,
                             "reasons": list(self.reasons), "counts": list(self.reasons.values())})

    @classmethod
    def from_record(cls, record: Mapping[str, Any], clients: int) -> Tally:
        """The tally a node's reply carries about its ``clients`` clients; ``ValueError`` for one that is not a
        tally of at most that many clients (a count that is not a whole number, a negative or inflated one)."""
        def count(value: Any, what: str) -> int:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"malformed report: {what} is {value!r}, not a count of clients")
            return value

        if not isinstance(record, ConfigRecord):
            raise ValueError(f"malformed report: a {type(record).__name__}, not a ConfigRecord")
        reasons, counts = record.get("reasons", []), record.get("counts", [])
        if not isinstance(reasons, list) or not isinstance(counts, list) or len(reasons) != len(counts):
            raise ValueError("malformed report: its reasons and their counts are not two lists of one length")
        tally = cls(count(record.get("together", 0), "'together'"), count(record.get("one-by-one", 0), "'one-by-one'"),
                    {str(w): count(n, f"the count of {str(w)[:80]!r}") for w, n in zip(reasons, counts)})
        if tally.together + tally.one_by_one > clients or sum(tally.reasons.values()) > tally.one_by_one:
            raise ValueError(f"malformed report: it counts {tally.together + tally.one_by_one} clients "
                             f"({tally.together} together, {tally.one_by_one} one by one, {sum(tally.reasons.values())} "
                             f"with reasons) where the node was sent {clients}")
        return tally

    def report(self, prefix: str, because: str) -> dict[str, Any]:
        """The summary's entries: ``<prefix>_together``, ``<prefix>_one_by_one`` and, if any, the reasons."""
        return {f"{prefix}_together": self.together, f"{prefix}_one_by_one": self.one_by_one,
                **({because: dict(self.reasons)} if self.reasons else {})}
