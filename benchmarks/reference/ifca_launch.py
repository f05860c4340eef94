"""Run the IFCA authors' own ``mnist/train_cluster_mnist.py`` (Ghosh et al. 2020, GitHub ``jichan3751/ifca``)
unchanged on this package's client data, and collect its accuracies.

    python benchmarks/reference/ifca_launch.py --root /tmp/refcheck/ifca \
        --data /tmp/refcheck/pfllib/dataset/Synthetic_ref --manifest /tmp/refcheck/export/synthetic.json \
        --out run.json --seed 0 --eval-every 5 -- --config-override '{"p": 2, "tau": 5, "lr": 0.05, "num_epochs": 100}'
    python benchmarks/reference/ifca_launch.py --root /tmp/refcheck/ifca --data ... --manifest ... --verify

Runs in this package's environment (the authors' code needs only torch, torchvision and NumPy) and
holds none of the authors' code. It changes to ``<root>/mnist`` (the module reads ``config.json`` from
the working directory and imports ``util`` from that folder), imports ``train_cluster_mnist`` and
replaces, from the outside, exactly three things:

* the data: ``TrainMNISTCluster.setup_datasets`` and ``load_data(m_i, train)``. Machine ``m_i`` is
  exported client ``i``; ``load_data`` returns its train or test split as ``export.py`` wrote it in
  PFLlib's format (``<data>/{train,test}/<i>.npz``: the floats this package feeds its model, Synthetic
  as (n, 60), images as (n, 1, 28, 28) in x / 127.5 - 1) as a float32 tensor, labels as int64. The
  authors' MNIST split, rotations and ground-truth cluster labels are not used: ``m`` = ``m_test`` =
  the number of clients, and the stored "true" assignment is all zeros, so the ``cl_acc`` the module
  prints is meaningless here (IFCA's accuracy does not use it);
* the model: ``train_cluster_mnist.SimpleLinear`` (784-h1-10 MLP ending in ``log_softmax``) becomes this
  package's model of the setting (``flower_pfl.experiment.models.build_model``: DNN 60-20-10 or the
  CNN), built without a seed of its own, so the authors' ``torch.manual_seed(train_seed)`` in
  ``setup_models`` draws the p cluster models' initialisations. It returns logits; the authors'
  criterion, ``torch.nn.CrossEntropyLoss``, takes logits (on their model's log-softmax output it gives
  the same loss);
* an extra figure: ``TrainMNISTCluster.test`` is wrapped. The authors' ``test(train=False)``
  (``get_inference_stats``) chooses each machine's cluster by the loss on its *test* data; the wrapper
  also counts the test predictions of the cluster that the machine's *training* data chose in the
  ``test(train=True)`` call just before (the paper's protocol, and this package's ``IFCAClient.evaluation_model``).

Everything else is the authors' code: ``main()``'s config (``config.json``, then ``--config-override``
JSON; ``train_seed`` = ``data_seed`` = ``--seed``), ``setup_models``, ``run`` (an evaluation of train
and test before the first round and after every round), ``train`` (every machine, every round: ``tau``
full-batch gradient steps on its whole training data from its cluster's model, then each cluster model
becomes the plain mean of its machines' models) and ``get_inference_stats`` (accuracy = correct / all
test samples, pooled over machines). Torch is limited to one thread.

``--out`` gets both series, subsampled to the rounds this harness's package runs evaluate (1 and every
``--eval-every``; the authors' code also evaluates before round 1 and after every round: full series
kept under ``*_every_round``). ``accuracy_weighted`` is the paper's protocol (cluster chosen on the
training data); ``authors_test_chosen_weighted`` the authors' printed test figure.

``--package-init`` (a diagnostic, not the authors' code as shipped) also wraps ``setup_models``: after it, the
p cluster models are set to this package's starting clusters for the same seed (``make_model(config, seed)``,
then ``flower_pfl.methods.ifca.initial_clusters``: that model and p - 1 seeded shuffles of it), so the two
implementations start from the same point.

``--verify`` reads every client's data back through the patched ``load_data`` and compares its digest
with the exporter's manifest.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from digest import digest  # this folder's digest.py (the script's folder is on sys.path)

REPO = Path(__file__).resolve().parents[2]


def load_clients(folder: Path, n: int) -> list[dict[str, np.ndarray]]:
    """The ``n`` clients' arrays from PFLlib-format files (``np.savez_compressed(data={'x', 'y'})``)."""
    out = []
    for i in range(n):
        c = {}
        for split in ("train", "test"):
            d = np.load(folder / split / f"{i}.npz", allow_pickle=True)["data"].item()
            c[f"x_{split}"], c[f"y_{split}"] = d["x"], d["y"]
        out.append(c)
    return out


def package_init(module, run_config: dict, seed: int) -> None:
    """Diagnostic: start the authors' p cluster models from this package's starting clusters (``--package-init``)."""
    from flower_pfl.engine.layout import ParamLayout, flatten_module, load_flat_
    from flower_pfl.experiment.build import make_model
    from flower_pfl.experiment.config import ExperimentConfig
    from flower_pfl.methods.ifca import initial_clusters

    original = module.TrainMNISTCluster.setup_models

    def setup_models(self):
        original(self)
        start = make_model(ExperimentConfig.from_mapping(run_config | {"seed": seed}), seed=seed)
        rows = initial_clusters(flatten_module(start), ParamLayout.from_module(start), self.config["p"], seed)
        for model, row in zip(self.models, rows):
            load_flat_(model.net, row)

    module.TrainMNISTCluster.setup_models = setup_models


def patch(module, clients: list[dict[str, np.ndarray]], run_config: dict) -> None:
    import torch

    from flower_pfl.experiment.models import build_model

    shape = tuple(clients[0]["x_train"].shape[1:])
    tensors = [{k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32 if k.startswith("x") else np.int64))
                for k, v in c.items()} for c in clients]

    def setup_datasets(self):
        m = len(tensors)
        assert self.config["m"] == m and self.config["m_test"] == m, "m and m_test must be the number of clients"
        self.dataset = {split: {"cluster_assign": np.zeros(m, dtype=np.int64)} for split in ("train", "test")}

    def load_data(self, m_i, train=True):
        c = tensors[m_i]
        return (c["x_train"], c["y_train"]) if train else (c["x_test"], c["y_test"])

    class PackageModel(torch.nn.Module):
        """In place of ``SimpleLinear(h1=...)``: this package's model of the setting (logits out)."""

        def __init__(self, h1: int = 20):
            super().__init__()
            self.net = build_model(run_config["model"], shape, 10, hidden=int(run_config.get("hidden-units", h1)))

        def forward(self, x):
            return self.net(x)

    original_test = module.TrainMNISTCluster.test

    def test(self, train=False):
        res = original_test(self, train=train)
        if train:
            self._train_chosen = list(res["cluster_assign"])
        else:  # the test split of every machine with the cluster its training data chose
            correct = num = 0
            with torch.no_grad():
                for m_i, p_i in enumerate(self._train_chosen):
                    X, y = self.load_data(m_i, train=False)
                    correct += self.n_correct(self.models[p_i](X), y)
                    num += X.shape[0]
            res["acc_train_chosen"] = correct / num
            res["cluster_assign_train_chosen"] = list(self._train_chosen)
        return res

    module.TrainMNISTCluster.setup_datasets = setup_datasets
    module.TrainMNISTCluster.load_data = load_data
    module.TrainMNISTCluster.test = test
    module.SimpleLinear = PackageModel


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--root", type=Path, required=True, help="the extracted jichan3751/ifca tree")
    p.add_argument("--data", type=Path, required=True, help="a PFLlib-format data set folder written by export.py")
    p.add_argument("--manifest", type=Path, required=True, help="export.py's manifest of that setting")
    p.add_argument("--out", type=Path, help="JSON file for the collected accuracies")
    p.add_argument("--seed", type=int, default=0, help="the authors' --data-seed (main() sets train_seed to it)")
    p.add_argument("--eval-every", type=int, default=5, help="rounds kept in the main series: 1 and multiples of this")
    p.add_argument("--verify", action="store_true", help="check the data only")
    p.add_argument("--package-init", action="store_true", help="diagnostic: this package's starting cluster models")
    p.add_argument("authors_args", nargs=argparse.REMAINDER, help="after --: the authors' own arguments")
    a = p.parse_args()
    authors_args = [x for x in a.authors_args if x != "--"]

    manifest = json.loads(a.manifest.resolve().read_text())
    clients = load_clients(a.data.resolve(), manifest["num_clients"])
    out = a.out.resolve() if a.out else None
    folder = (a.root / "mnist").resolve()
    os.chdir(folder)
    sys.path.insert(0, str(folder))
    sys.path.insert(1, str(REPO))  # this package (its models only)
    import torch

    torch.set_num_threads(1)
    import train_cluster_mnist as authors

    patch(authors, clients, manifest["run_config"])
    if a.package_init:
        package_init(authors, manifest["run_config"], a.seed)
    if a.verify:
        exp = authors.TrainMNISTCluster.__new__(authors.TrainMNISTCluster)
        ok = []
        for i, want in enumerate(manifest["sha256"]):
            parts = [t.numpy() for train in (True, False) for t in exp.load_data(i, train=train)]
            ok.append(digest(*parts) == want)
        print(json.dumps({"library": "ifca-authors", "setting": manifest["setting"], "clients": len(ok), "identical": sum(ok)}))
        return

    project = out.with_suffix("") if out else Path(f"/tmp/ifca-run-{os.getpid()}")
    sys.argv = ["train_cluster_mnist.py", "--data-seed", str(a.seed), "--project-dir", str(project), *authors_args]
    config = authors.get_config() | {"train_seed": a.seed}  # what main() reads (it sets train_seed = data_seed)
    t0 = time.time()
    authors.main()  # config, TrainMNISTCluster(config).setup(), .run(): results.pickle in the project dir
    seconds = time.time() - t0

    import pickle

    with open(project / "results.pickle", "rb") as f:
        results = pickle.load(f)
    rounds_all = [r["epoch"] + 1 for r in results]  # epoch -1: before round 1; epoch e: after round e + 1
    train_chosen = [float(r["test"]["acc_train_chosen"]) for r in results]
    test_chosen = [float(r["test"]["acc"]) for r in results]
    keep = [i for i, r in enumerate(rounds_all) if r == 1 or (r > 0 and r % a.eval_every == 0)]
    acc = [train_chosen[i] for i in keep]
    authors_fig = [test_chosen[i] for i in keep]
    last = results[-1]
    result = {
        "library": "ifca-authors", "argv": sys.argv[1:], "package_init": a.package_init, "config": config, "seed": a.seed, "seconds": round(seconds, 1),
        "rounds": [rounds_all[i] for i in keep],
        "accuracy_weighted": acc, "authors_test_chosen_weighted": authors_fig,
        "final_weighted": acc[-1], "best_weighted": max(acc),
        "authors_test_chosen_final": authors_fig[-1], "authors_test_chosen_best": max(authors_fig),
        "rounds_every_round": rounds_all, "accuracy_every_round": train_chosen,
        "authors_test_chosen_every_round": test_chosen,
        "cluster_sizes_final": [int(x) for x in np.bincount(last["train"]["cluster_assign"], minlength=config["p"])],
        "clusters_differ_train_vs_test": int(sum(x != y for x, y in zip(last["test"]["cluster_assign_train_chosen"],
                                                                         last["test"]["cluster_assign"]))),
        "results_pickle": str(project / "results.pickle"),
    }
    if out:
        out.write_text(json.dumps(result, indent=1))
    else:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
