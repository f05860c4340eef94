"""The client-speed benchmark's command at a tiny size: the four ways run on the same clients and the
table says how they compare (the figures themselves are the benchmark's, not the test's)."""

from __future__ import annotations

import json

from benchmarks import client_speed


def test_the_four_ways_are_timed_and_tabled(tmp_path):
    result = client_speed.main(["--models", "mlr", "--devices", "cpu", "--rounds", "3", "--repeats", "2", "--out", str(tmp_path)])
    (row,) = result["rows"]
    ways = ("bare_sequential", "bare_batched", "package_sequential", "package_batched")
    assert all(row[w] > 0 and len(row["all"][w]) == 2 for w in ways)
    table = (tmp_path / "table.md").read_text()
    assert f"| mlr | cpu | {row['bare_sequential']:.4f} | {row['bare_batched']:.4f} |" in table
    assert json.loads((tmp_path / "results.json").read_text())["rows"][0]["package_batched"] == row["package_batched"]
