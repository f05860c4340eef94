"""The scale benchmark's command at a tiny size: the table and ``results.json`` give each setting's time per
round and its peaks (the figures themselves are the benchmark's). The setting runs in the test's process
(the benchmark gives each a fresh one, for its own peak: a fresh process's imports take seconds)."""

from __future__ import annotations

import json

from benchmarks import scale


def test_each_setting_is_timed_and_its_peaks_tabled(tmp_path, monkeypatch):
    monkeypatch.setattr(scale, "in_fresh_process", scale.run_setting)
    result = scale.main(["--clients", "6", "--store", "memory", "--rounds", "2", "--per-round", "2", "--local-steps", "1",
                         "--images", "120", "--device", "cpu", "--out", str(tmp_path)])
    (row,) = result["rows"]
    assert (row["clients"], row["store"], row["device"]) == (6, "memory", "cpu") and len(row["rounds_s"]) == 2
    assert row["round_s"] == row["rounds_s"][1] > 0 and row["evaluation_s"] > 0
    assert 0 < row["host_start"] <= row["host_peak_rounds"] <= row["host_peak"] and row["device_peak"] is None
    table = (tmp_path / "table.md").read_text()
    assert f"| 6 | memory | cpu | {row['round_s']:.3f} | {row['evaluation_s']:.2f} | n/a / n/a | " in table
    assert "5.08 GB of GPU memory" in table
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["rows"][0]["host_peak"] == row["host_peak"] and saved["reference"]["gpu_memory_gb"] == 5.08
