"""A run's process leaves the objects alive at the start of its rounds out of the garbage collector's full
collections, and hands them back after (``flower_pfl.run.heap``)."""

from __future__ import annotations

import gc

import server_apps.app as server_app
from flower_pfl.run.heap import frozen_heap
from server_apps.inprocess import run_in_process


def test_the_objects_alive_at_the_start_are_frozen_inside_and_handed_back_after():
    before = gc.get_freeze_count()
    with frozen_heap():
        inside = gc.get_freeze_count()
        made = [[]]
        made[0].append(made)  # a cycle made inside is collected inside
        del made
        assert gc.collect() > 0
    assert inside > before and gc.get_freeze_count() == 0


def test_a_run_trains_with_the_heap_frozen_and_unfreezes_it(monkeypatch, tmp_path):
    seen, train = [], server_app._train
    monkeypatch.setattr(server_app, "_train", lambda *args: (seen.append(gc.get_freeze_count()), train(*args))[1])
    run_in_process({"method": "fedavg", "num-rounds": 1, "clients-per-round": 2, "local-steps": 1, "output-dir": str(tmp_path)},
                   num_clients=4)
    assert seen and seen[0] > 1000 and gc.get_freeze_count() == 0
