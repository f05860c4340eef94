"""Screenshots of a tracked sweep in TensorBoard and the MLflow UI, as a person would look at it.

    python -m benchmarks.tracker_screenshots --out docs/images

Runs a small sweep with ``tracker = "tensorboard,mlflow"`` (FedMCSA, FedAvg and Local, 2 seeds,
Synthetic with 30 clients, 30 rounds), starts TensorBoard and the MLflow UI on it (each on a free
local port, in its own process group, stopped by this script), checks through their own HTTP APIs
that every run's curves and figures are served, and takes screenshots with headless Chromium
(``apt install chromium``): ``tensorboard-curves.png``, ``tensorboard-figures.png``, ``mlflow-charts.png``.
Needs the ``tensorboard`` and ``mlflow`` extras.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from flower_pfl.tools import sweep as sweep_tool
from flower_pfl.tools.sweep_grid import Sweep

SWEEP = Sweep(methods=["fedmcsa", "fedavg", "local"], seeds=[0, 1], name="demo", references=[],
              base={"num-nodes": 30, "clients-per-round": 10, "num-rounds": 30, "eval-every": 5, "checkpoint-every": 0,
                    "tracker": "tensorboard,mlflow"})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def server(command: list[str], url: str, log: Path, timeout: float = 120) -> Iterator[None]:
    """``command`` in its own process group until ``url`` answers; the group is stopped on exit."""
    with log.open("w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                urllib.request.urlopen(url, timeout=5)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{command[0]} did not answer at {url}; see {log}") from None
                time.sleep(0.5)
        yield
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def get(url: str, body: dict[str, Any] | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(request, timeout=30).read())


def check_tensorboard(base: str) -> None:
    """Every run serves its accuracy curve, its clients' histogram and its learning curve; FedMCSA its attention."""
    scalars, images = get(f"{base}/data/plugin/scalars/tags"), get(f"{base}/data/plugin/images/tags")
    histograms = get(f"{base}/data/plugin/histograms/tags")
    assert len(scalars) == 6, sorted(scalars)
    for run, tags in scalars.items():
        assert "evaluate/accuracy-mean" in tags and "train/train-loss" in tags, run
        assert "evaluate/client-accuracy" in histograms[run], run
        assert "figures/learning_curve" in images[run] and ("figures/attention" in images[run]) == run.startswith("fedmcsa"), run
        points = get(f"{base}/data/plugin/scalars/scalars?run={urllib.request.quote(run)}&tag=evaluate/accuracy-mean")
        assert [p[1] for p in points] == [1, 5, 10, 15, 20, 25, 30], run


def check_mlflow(base: str) -> str:
    """Six finished runs in the sweep's experiment, each with its accuracy curve and figures; returns its id."""
    experiment = get(f"{base}/api/2.0/mlflow/experiments/get-by-name?experiment_name=demo")["experiment"]["experiment_id"]
    runs = get(f"{base}/api/2.0/mlflow/runs/search", {"experiment_ids": [experiment]})["runs"]
    assert len(runs) == 6 and all(r["info"]["status"] == "FINISHED" for r in runs)
    for run in runs:
        run_id = run["info"]["run_id"]
        history = get(f"{base}/api/2.0/mlflow/metrics/get-history?run_id={run_id}&metric_key=evaluate/accuracy-mean")
        assert [m["step"] for m in history["metrics"]] == [1, 5, 10, 15, 20, 25, 30], run_id
        files = get(f"{base}/api/2.0/mlflow/artifacts/list?run_id={run_id}&path=figures")["files"]
        assert "figures/learning_curve.png" in {f["path"] for f in files}, run_id
    return str(experiment)


def screenshot(browser: str, url: str, path: Path, width: int = 1700, height: int = 1050) -> None:
    subprocess.run([browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--window-size={width},{height}", "--virtual-time-budget=30000", f"--screenshot={path}", url],
                   check=True, capture_output=True, timeout=180)
    print(f"wrote {path} ({path.stat().st_size} bytes)")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("docs/images"), help="folder for the screenshots")
    args = ap.parse_args(argv)
    browser = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
    if browser is None:
        sys.exit("no Chromium found: apt install chromium (or put chromium or google-chrome on PATH)")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tracker-shots-") as work:
        sweep_dir = Path(work) / "demo"
        sweep_tool.run(SWEEP, sweep_dir, workers=2, progress=False)
        tb, ml = free_port(), free_port()
        tb_url, ml_url = f"http://127.0.0.1:{tb}", f"http://127.0.0.1:{ml}"
        bin_dir = Path(sys.executable).parent
        with server([str(bin_dir / "tensorboard"), "--logdir", str(sweep_dir / "runs"), "--host", "127.0.0.1", "--port", str(tb)],
                    tb_url, Path(work) / "tensorboard.log"), \
             server([str(bin_dir / "mlflow"), "ui", "--backend-store-uri", f"sqlite:///{sweep_dir / 'mlflow.db'}",
                     "--host", "127.0.0.1", "--port", str(ml)], ml_url, Path(work) / "mlflow.log"):
            check_tensorboard(tb_url)
            experiment = check_mlflow(ml_url)
            print("TensorBoard and the MLflow UI serve every run's curves and figures")
            # forceSVG: TensorBoard's WebGL charts draw nothing in a browser without a GPU
            screenshot(browser, f"{tb_url}/?forceSVG=true#timeseries", args.out / "tensorboard-curves.png")
            screenshot(browser, f"{tb_url}/#images&regexInput=fedmcsa%2Fbase%2Fseed0", args.out / "tensorboard-figures.png")
            screenshot(browser, f"{ml_url}/#/experiments/{experiment}/runs?compareRunsMode=CHART", args.out / "mlflow-charts.png",
                       width=2000)


if __name__ == "__main__":
    main()
