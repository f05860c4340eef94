"""Sentences built from counts: a count agrees with its noun, and the verb or pronoun with the count
(``counted(1, "node")`` is ``1 node``; ``agreeing(2, "it was", "they were")`` is ``they were``)."""

from __future__ import annotations


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``1 node``, ``0 nodes``, ``3 nodes``; ``plural`` where it is not ``noun`` + ``s``
    (``counted(2, "client's reply", "clients' replies")``)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def agreeing(n: int, singular: str, plural: str) -> str:
    """``singular`` for a count of one, else ``plural``: a verb or pronoun that agrees with ``n``."""
    return singular if n == 1 else plural
