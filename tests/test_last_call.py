"""``LastCall``: a function's value for the object it was last called with, by identity and per thread."""

from __future__ import annotations

import threading

from flower_pfl.engine.last_call import LastCall


def test_the_same_object_is_answered_from_the_last_call_and_an_equal_one_is_made_again():
    calls: list[dict[str, int]] = []
    last = LastCall(lambda key: calls.append(key) or len(calls))
    first = {"a": 1}
    assert last(first) == 1 and last(first) == 1 and calls == [first]
    assert last({"a": 1}) == 2  # equal, not the same: asked again
    assert last(first) == 3 and len(calls) == 3  # only the last call is kept


def test_each_thread_keeps_its_own_last_call():
    key, seen = object(), []
    last = LastCall(lambda k: threading.get_ident())
    assert last(key) == threading.get_ident()
    other = threading.Thread(target=lambda: seen.append(last(key)))
    other.start()
    other.join()
    assert seen[0] != threading.get_ident() and last(key) == threading.get_ident()  # neither answered with the other's
