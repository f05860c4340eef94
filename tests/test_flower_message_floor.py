"""Flower's own share of an in-process round (``benchmarks/flower_message_floor.py``): its FedAvg really
instructs, gets and aggregates every client's reply."""

from __future__ import annotations

import logging

import pytest

from benchmarks.flower_message_floor import DNN_SHAPES, evaluation_floor, main, training_floor


def test_flowers_fedavg_alone_aggregates_every_clients_evaluation():
    times, aggregated = evaluation_floor(clients=7, repeats=2)
    assert set(times) == {"configure", "replies", "aggregate", "total"} and all(t > 0 for t in times.values())
    assert times["total"] == pytest.approx(times["configure"] + times["replies"] + times["aggregate"])
    weights = [10 + i % 7 for i in range(7)]
    assert aggregated["accuracy"] == pytest.approx(sum(w * (i % 10) / 10 for i, w in enumerate(weights)) / sum(weights))


def test_flowers_fedavg_alone_trains_the_sampled_clients_and_averages_their_arrays():
    times, (arrays, metrics) = training_floor(clients=10, per_round=4, repeats=2)
    assert all(t > 0 for t in times.values())
    assert {k: tuple(a.shape) for k, a in arrays.items()} == DNN_SHAPES and metrics["train-loss"] == pytest.approx(0.5)


def test_the_table_names_both_rounds_and_flowers_log_is_left_as_it_was(capsys):
    flower = logging.getLogger("flwr")
    level = flower.level
    result = main(["--clients", "6", "--per-round", "3", "--repeats", "1"])
    assert flower.level == level
    assert set(result) == {"evaluation", "training"}
    out = capsys.readouterr().out
    assert "| evaluation of 6 clients |" in out and "| training of 3 clients |" in out
