"""Run PFLlib's own ``system/main.py`` unchanged, in PFLlib's environment, and collect its accuracies.

    /tmp/refcheck/venv-pfllib/bin/python benchmarks/reference/pfllib_launch.py --root /tmp/refcheck/pfllib \
        --out run.json --seed 0 -- -algo FedAvg -data Synthetic_ref -m DNN -gr 100 -jr 0.2 -nc 100 ...
    /tmp/refcheck/venv-pfllib/bin/python benchmarks/reference/pfllib_launch.py --root ... --verify manifest.json

This file holds none of PFLlib's code: it changes to ``<root>/system`` (PFLlib reads
``../dataset/<name>`` relative to it), seeds Python's and NumPy's global generators (PFLlib samples
clients with ``np.random.choice`` and never seeds NumPy; ``main.py`` seeds torch with 0 itself),
limits torch to one thread, and executes ``main.py`` as ``__main__`` with the given arguments.
PFLlib evaluates before the training of rounds ``0, eg, 2 eg, ..., gr`` (so the entry for ``i`` is the
model after ``i`` rounds) and saves that series (``rs_test_acc``: correct / test samples summed over all
clients, i.e. sample-weighted) to ``../results/<data>_<algo>_<goal>_0.h5``, which is read back here.
``--dnn-logits`` replaces ``flcore.trainmodel.models.DNN.forward`` by the same network without its
final ``F.log_softmax``. For whole-model algorithms this changes nothing (cross-entropy of log-softmax
outputs equals cross-entropy of the logits, and the argmax is the same), but ``main.py`` splits the
model for FedAvg, FedPer, FedRep, FedRoD, FedProto, MOON, FedBABU, LG-FedAvg, ... into
``BaseHeadSplit(base=model with fc = Identity, head=fc)``, and then the base's forward ends in a
log-softmax over the 20 *hidden* features: a different network than DNN 60-20-10 (see README.md).
FedAS's server calls ``avg_generalization_metrics``, which no PFLlib class defines, after its last round and
before it saves its results: the launcher adds it (returning ``None``) where it is missing.
``--php-eval-hpm`` (diagnostic) makes FedPHP's clients (``clientPHP``) evaluate their HPM ``model_p`` instead of
their ``model`` (the global model just received, or the local model of a client that trained this round).
``--torch-seed-is-seed`` (diagnostic) adds ``--seed`` to every seed PFLlib gives torch: ``main.py`` seeds it with 0
and so does every client's constructor (``clientbase.py``), so that without the flag the initial model, every
minibatch order and every torch draw (FedCP's Gumbel noise, its initial conditional input) are the same for every
``--seed``, which then varies only the clients sampled. With seed 0 the flag changes nothing.
``--cp-package-reading`` (diagnostic) runs PFLlib's FedCP with this package's four readings of the paper: a client
uploads its personalized head (``clientcp.py`` uploads its mean with the global head), every client gets the
aggregated global head and CPN (``servercp.py`` hands them to the round's participants only), the conditional input
comes from the personalized head from the start (PFLlib's is a random vector until the client's first round ends),
and evaluation takes the policy without Gumbel noise.
``--verify`` reads every client's data through PFLlib's ``read_client_data`` and compares it with the
exporter's manifest.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import runpy
import sys
import time
from pathlib import Path

import numpy as np
from digest import digest  # this folder's digest.py (the script's folder is on sys.path)


def verify(manifest_path: Path) -> dict:
    import torch
    from utils.data_utils import read_client_data

    m = json.loads(manifest_path.read_text())
    ok = []
    for i, want in enumerate(m["sha256"]):
        parts = []
        for train in (True, False):
            data = read_client_data(m["pfllib_dataset"], i, is_train=train)
            parts += [torch.stack([x for x, _ in data]).numpy(), torch.stack([y for _, y in data]).numpy()]
        ok.append(digest(*parts) == want)
    return {"library": "pfllib", "setting": m["setting"], "clients": len(ok), "identical": sum(ok)}


def record_client_accuracies(system: Path) -> list[tuple[float, float]]:
    """Wrap ``test_metrics`` of every PFLlib server class that defines it (it returns ``ids, num_samples,
    tot_correct, tot_auc``, one entry per client): each call appends (pooled accuracy, unweighted mean of
    the clients' accuracies) to the returned list. ``Server.evaluate`` records only the pooled figure."""
    import importlib
    import inspect
    import pkgutil

    from flcore.servers.serverbase import Server

    calls: list[tuple[float, float]] = []

    def wrap(method):
        def test_metrics(self, *args, **kwargs):
            stats = method(self, *args, **kwargs)
            num, correct = stats[1], stats[2]
            if sum(num) > 0:
                calls.append((sum(correct) / sum(num), float(np.mean([c / n for c, n in zip(correct, num)]))))
            return stats
        return test_metrics

    for info in pkgutil.iter_modules([str(system / "flcore" / "servers")]):
        try:
            module = importlib.import_module(f"flcore.servers.{info.name}")
        except Exception:  # a server module whose optional dependencies are missing: main.py fails on it too
            continue
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, Server) and "test_metrics" in cls.__dict__ and not getattr(cls.test_metrics, "_wrapped", False):
                cls.test_metrics = wrap(cls.__dict__["test_metrics"])
                cls.test_metrics._wrapped = True
    return calls


def client_means(pooled: list[float], calls: list[tuple[float, float]]) -> list[float | None]:
    """For each entry of ``rs_test_acc``, the client mean of the ``test_metrics`` call that produced it (the
    next recorded call, in order, with the same pooled accuracy); ``None`` where none matches (a server that
    computes its figure otherwise)."""
    out, k = [], 0
    for acc in pooled:
        j = next((j for j in range(k, len(calls)) if abs(calls[j][0] - acc) < 1e-9), None)
        out.append(None if j is None else calls[j][1])
        k = k if j is None else j + 1
    return out


def fedcp_package_reading() -> None:
    """Patch PFLlib's FedCP to this package's readings (``--cp-package-reading``, see the module docstring)."""
    import torch
    from flcore.clients.clientcp import clientCP
    from flcore.servers.servercp import ConditionalSelection, FedCP

    init = clientCP.__init__

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.context = self.model.model.head.weight.detach().sum(0, keepdim=True).clone()

    def upload_personal_head(self):
        for personal, upload in zip(self.model.model.head.parameters(), self.model.head_g.parameters()):
            upload.data = personal.data.clone()

    global_head, global_cs = FedCP.global_head, FedCP.global_cs

    def head_to_all(self):
        global_head(self)
        for client in self.clients:
            client.set_head_g(self.head)

    def cs_to_all(self):
        global_cs(self)
        for client in self.clients:
            client.set_cs(self.cs)

    gumbel_policy = ConditionalSelection.forward

    def policy(self, x, tau=1, hard=False):
        if self.training:
            return gumbel_policy(self, x, tau=tau, hard=hard)
        z = torch.softmax(self.fc(x).view(x.shape[0], 2, -1) / tau, dim=1)
        return z[:, 0, :], z[:, 1, :]

    clientCP.__init__, clientCP.generate_upload_head = __init__, upload_personal_head
    FedCP.global_head, FedCP.global_cs, ConditionalSelection.forward = head_to_all, cs_to_all, policy


def arg(argv: list[str], flag: str, default: str) -> str:
    return argv[argv.index(flag) + 1] if flag in argv else default


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--root", type=Path, required=True, help="the extracted PFLlib tree")
    p.add_argument("--out", type=Path, help="JSON file for the collected accuracies")
    p.add_argument("--log", type=Path, help="file for PFLlib's console output (default: next to --out)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--verify", type=Path, help="an export manifest: check the data only")
    p.add_argument("--dnn-logits", action="store_true",
                   help="DNN.forward without its final log_softmax (see the module docstring)")
    p.add_argument("--php-eval-hpm", action="store_true",
                   help="diagnostic: FedPHP's clients evaluate their HPM (model_p), not their model")
    p.add_argument("--torch-seed-is-seed", action="store_true",
                   help="diagnostic: add --seed to every seed PFLlib gives torch (see the module docstring)")
    p.add_argument("--cp-package-reading", action="store_true",
                   help="diagnostic: PFLlib's FedCP with this package's readings (see the module docstring)")
    p.add_argument("pfllib_args", nargs=argparse.REMAINDER)
    a = p.parse_args()
    argv = [x for x in a.pfllib_args if x != "--"]

    system = (a.root / "system").resolve()
    os.chdir(system)
    sys.path.insert(0, str(system))
    import torch

    torch.set_num_threads(1)
    if a.torch_seed_is_seed:
        manual_seed = torch.manual_seed
        torch.manual_seed = lambda seed: manual_seed(seed + a.seed)
    if a.verify:
        print(json.dumps(verify(a.verify.resolve())))
        return

    if a.dnn_logits:
        import torch.nn.functional as F
        from flcore.trainmodel import models

        def forward(self, x):  # DNN.forward less its last line, x = F.log_softmax(x, dim=1)
            return self.fc(F.relu(self.fc1(torch.flatten(x, 1))))

        models.DNN.forward = forward
    if a.php_eval_hpm:
        from flcore.clients.clientphp import clientPHP

        test_metrics = clientPHP.test_metrics

        def test_hpm(self):  # the same evaluation, of model_p
            model, self.model = self.model, self.model_p
            try:
                return test_metrics(self)
            finally:
                self.model = model

        clientPHP.test_metrics = test_hpm
    if a.cp_package_reading:
        fedcp_package_reading()
    calls = record_client_accuracies(system)
    from flcore.servers.serverbase import Server

    if not hasattr(Server, "avg_generalization_metrics"):
        # serveras.py (FedAS) prints it after the last round, before saving its results; PFLlib defines it nowhere
        Server.avg_generalization_metrics = lambda self: None
    random.seed(a.seed)
    np.random.seed(a.seed)
    goal = f"ref{os.getpid()}"
    argv = [*argv, "-go", goal, "-dev", "cpu"]
    log = a.log or a.out.with_suffix(".log")
    t0 = time.time()
    sys.argv = ["main.py", *argv]
    with open(log, "w") as fh, contextlib.redirect_stdout(fh):
        runpy.run_path("main.py", run_name="__main__")
    seconds = time.time() - t0

    import h5py

    data, algo, gap = arg(argv, "-data", "MNIST"), arg(argv, "-algo", "FedAvg"), int(arg(argv, "-eg", "1"))
    h5 = system.parent / "results" / f"{data}_{algo}_{goal}_0.h5"
    with h5py.File(h5, "r") as hf:
        acc = [float(v) for v in hf["rs_test_acc"][:]]
    h5.unlink()
    mean = client_means(acc, calls)
    result = {
        "library": "pfllib", "argv": argv, "seed": a.seed, "dnn_logits": a.dnn_logits, "php_eval_hpm": a.php_eval_hpm,
        "torch_seed_is_seed": a.torch_seed_is_seed, "cp_package_reading": a.cp_package_reading, "seconds": round(seconds, 1),
        "rounds": [i * gap for i in range(len(acc))], "accuracy_weighted": acc, "accuracy_mean": mean,
        "final_weighted": acc[-1], "best_weighted": max(acc), "log": str(log),
    }
    if mean and None not in mean:
        result |= {"final_mean": mean[-1], "best_mean": max(mean)}
    a.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
