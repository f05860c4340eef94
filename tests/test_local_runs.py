"""The end-to-end tests' own tools (``local_runs``): a run that takes too long is described by its phases,
and the app ``flwr run`` bundles is what its ``fab-include`` names."""

from __future__ import annotations

import subprocess
import sys
import tomllib

from local_runs import ROOT, Streamed, staged_app

SLOW_RUN = """
import sys, time
print("Using SuperLink: local (127.0.0.1:1)", flush=True)
print("Successfully started run 4242", flush=True)
print("INFO :      flower-pfl: round 1/3  accuracy-mean 0.5", flush=True)
time.sleep(60)
"""


def test_a_run_past_its_time_is_described_by_its_phases_and_last_lines():
    stream = Streamed(subprocess.Popen([sys.executable, "-c", SLOW_RUN], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       text=True))
    try:
        assert not stream.wait(timeout=3)
        assert stream.run_id() == 4242
        said = stream.phases()
        assert "submitted at 0 s" in said and "a round at 0 s" in said and "nothing since for " in said, said
        assert said.endswith("round 1/3  accuracy-mean 0.5") and "Using SuperLink" in said, said
    finally:
        stream.proc.kill()
    assert stream.wait(timeout=30) and stream.text().count("\n") == 3


def test_the_staged_app_holds_what_flwr_run_bundles_and_nothing_else():
    stage = staged_app(ROOT)
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["fab-include"]
    bundled = {p.relative_to(ROOT) for pattern in patterns for p in ROOT.glob(pattern) if "__pycache__" not in p.parts}
    staged = {p.relative_to(stage) for p in stage.rglob("*") if p.is_file()}
    assert staged == bundled | {ROOT.joinpath("pyproject.toml").relative_to(ROOT)}
    assert (stage / "client_apps" / "app.py").read_text() == (ROOT / "client_apps" / "app.py").read_text()
