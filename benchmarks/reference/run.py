"""Run one method in this package, in PFLlib and in FL-bench on the same data, and record the accuracies.

    python benchmarks/reference/run.py --setting synthetic --methods fedavg local
    python benchmarks/reference/run.py --setting images --methods fedavg --libs package flbench
    python benchmarks/reference/run.py --table          # results/table.md from results/<setting>.json

Run ``export.py`` first (it writes the data the two libraries read). Each library runs in its own
process, one at a time: this package in-process (``server_apps.inprocess.run_in_process``, the real
ServerApp/ClientApp code), PFLlib and FL-bench through ``pfllib_launch.py`` / ``flbench_launch.py`` in
their own virtual environments (see README.md). All three use the setting's rounds, clients per round,
local work (one epoch of 100 samples in batches of 20 = ``local-steps`` 5), learning rate and model;
every library draws its own client sample and initial model from its own seed (they cannot be shared).
IFCA, which neither library has, is compared with its authors' own code (``ifca_launch.py``, lib
``ifca-authors``, in this package's venv), which trains every client every round with full-batch
gradient steps: the like-for-like package run is method ``ifca-full-batch``.

The figure compared is the **sample-weighted** test accuracy over all clients (correct predictions /
test samples, pooled), because it is the one PFLlib (``Server.evaluate``) and FL-bench (``Metrics``
pooled over clients) report; this package's run also records its unweighted mean over clients
(``accuracy-mean``, the papers' figure). "final" is the last evaluation (after the last round), "best"
the best evaluation of the run (PFLlib's "Best accuracy", FL-bench's "Max Accuracy"). Evaluations:
every ``eval-every`` rounds (this package also after round 1, PFLlib also before round 1).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.reference.settings import (
    FLBENCH_PYTHON,
    FLBENCH_ROOT,
    IFCA_ROOT,
    PFLLIB_PYTHON,
    PFLLIB_ROOT,
    SCRATCH,
    SETTINGS,
    run_config,
)

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RESULTS = HERE / "results"
LIBS = ("package", "pfllib", "flbench", "ifca-authors")

#: per method: this package's run-config overrides, PFLlib's main.py arguments, FL-bench's Hydra overrides and,
#: for IFCA only, the IFCA authors' config keys (``ifca-authors``, see ``ifca_config``).
#: None or absent: the library has no such method. Method hyperparameters are set to the same values where both
#: sides have them (see each entry); the rest stay at each library's defaults.
METHODS: dict[str, dict[str, Any]] = {
    "fedavg": {"package": {"method": "fedavg"}, "pfllib": ["-algo", "FedAvg"], "flbench": ["method=fedavg"]},
    # evidence runs: PFLlib's FedAvg with its DNN as shipped (log_softmax inside the split base), and
    # PFLlib's FedProx with mu = 0, i.e. FedAvg without main.py's BaseHeadSplit (see README)
    "fedavg-pfllib-as-shipped": {"package": None, "pfllib": ["-algo", "FedAvg"], "pfllib_flags": [], "flbench": None},
    "fedavg-pfllib-fedprox-mu0": {"package": None, "pfllib": ["-algo", "FedProx", "-mu", "0"], "flbench": None},
    # evidence run: FL-bench with its Synthetic loader as shipped (features divided by 255)
    "fedavg-flbench-as-shipped": {"package": None, "pfllib": None, "flbench": ["method=fedavg"],
                                  "flbench_flags": ["--native-rescale"]},
    "local": {"package": {"method": "local"}, "pfllib": ["-algo", "Local"], "flbench": ["method=local"]},
    # 5 head steps then 5 body steps: PFLlib -pls 1 head epoch + -ls 1 body epoch; FL-bench 2 epochs, the last the body's
    "fedrep": {"package": {"method": "fedrep", "local-steps": 10, "fedrep-body-steps": 5, "fedrep-head-layers": 1},
               "pfllib": ["-algo", "FedRep", "-pls", "1"],
               "flbench": ["method=fedrep", "common.local_epoch=2", "+fedrep.train_body_epoch=1"]},
    "lgfedavg": {"package": {"method": "lgfedavg", "lgfedavg-global-layers": 1}, "pfllib": ["-algo", "LG-FedAvg"],
                 "flbench": ["method=lgfedavg", "+lgfedavg.num_global_layers=1"]},
    "fedrod": {"package": {"method": "fedrod", "fedrod-balanced": True}, "pfllib": ["-algo", "FedROD"],
               "flbench": ["method=fedrod", "+fedrod.gamma=1", "+fedrod.hyper=0"]},
    # the head fine-tuned (whole model, 10 epochs = 50 steps) before evaluation: PFLlib once after the last
    # round (-fte 10), FL-bench at every test (finetune_epoch 10), this package at every evaluation
    "fedbabu": {"package": {"method": "fedbabu", "fedbabu-finetune-steps": 50, "fedbabu-finetune-part": "full",
                            "fedbabu-finetune-batch-size": 20, "fedbabu-finetune-lr": "=lr"},
                "pfllib": ["-algo", "FedBABU", "-fte", "10"],
                "flbench": ["method=fedbabu", "common.test.client.finetune_epoch=10"]},
    "fedbn": {"package": {"method": "fedbn", "fedbn-weighted": True}, "pfllib": ["-algo", "FedBN"], "flbench": ["method=fedbn"]},
    "fedfomo": {"package": {"method": "fedfomo", "fedfomo-models": 5, "fedfomo-val-fraction": 0.2},
                "pfllib": ["-algo", "FedFomo", "-M", "5"],
                "flbench": ["method=fedfomo", "+fedfomo.M=5", "+fedfomo.valset_ratio=0.2"]},
    # PFLlib: -dlr is apple-p-lr (its default 0 never moves p_i), -L the schedule's share of the rounds
    "apple": {"package": {"method": "apple", "apple-p-lr": 0.001, "apple-mu": 0.1, "apple-schedule-rounds": 16},
              "pfllib": ["-algo", "APPLE", "-dlr", "0.001", "-mu", "0.1", "-L", "0.16"], "flbench": None},
    # PFLlib's APPLE trains every client every round whatever -jr says (serverapple.py: `for client in self.clients:
    # client.train(i)`): this package with all 100 clients per round is the like-for-like run
    "apple-all-clients": {"package": {"method": "apple", "apple-p-lr": 0.001, "apple-mu": 0.1, "apple-schedule-rounds": 16,
                                      "clients-per-round": "=all"}, "pfllib": None, "flbench": None},
    # PFLlib -p 2 / FL-bench layer_idx 2: the last two tensors = the last layer (fedala-layers 1)
    "fedala": {"package": {"method": "fedala", "fedala-eta": 1.0, "fedala-rand-percent": 80.0, "fedala-layers": 1},
               "pfllib": ["-algo", "FedALA", "-et", "1.0", "-s", "80", "-p", "2"],
               "flbench": ["method=fedala", "+fedala.layer_idx=2", "+fedala.eta=1.0", "+fedala.rand_percent=0.8"]},
    # diagnostic: every client trains every round in both (PFLlib -jr 1), so every client also runs ALA every round,
    # as PFLlib's send_models does for all clients whoever trains (serverala.py)
    "fedala-all-clients": {"package": {"method": "fedala", "fedala-eta": 1.0, "fedala-rand-percent": 80.0, "fedala-layers": 1,
                                       "clients-per-round": "=all"},
                           "pfllib": ["-algo", "FedALA", "-et", "1.0", "-s", "80", "-p", "2", "-jr", "1.0"], "flbench": None},
    # diagnostic: this package's FedALA evaluating the ALA output of the current global model, as PFLlib does
    "fedala-pkg-eval-ala": {"package": {"method": "fedala", "fedala-eta": 1.0, "fedala-rand-percent": 80.0, "fedala-layers": 1,
                                        "_diagnostic": "fedala-eval-ala"}, "pfllib": None, "flbench": None},
    # FL-bench's embedding size default is 1 + n/4 (26 for 100 clients); buffers must not be global there
    "pfedhn": {"package": {"method": "pfedhn", "pfedhn-embed-dim": "=1+n/4"}, "pfllib": None,
               "flbench": ["method=pfedhn", "common.buffers=local", "+pfedhn.version=pfedhn"]},
    # diagnostic: λ = 1 (the kNN classifier alone) in both, to separate the kNN part from the mixing rule
    "knnper-knn-only": {"package": {"method": "knnper", "knnper-k": 5, "knnper-lambda": 1.0, "knnper-scale": 1.0}, "pfllib": None,
                        "flbench": ["method=knnper", "+knnper.k=5", "+knnper.weight=1.0", "+knnper.scale=1"]},
    "ifca": {"package": {"method": "ifca", "ifca-clusters": 2}, "pfllib": None, "flbench": None},
    # IFCA like the authors' code runs it (mnist/train_cluster_mnist.py): every client every round, tau = 5
    # full-batch gradient steps on its whole training set (batch = its 100 samples), p = 2 clusters
    "ifca-full-batch": {"package": {"method": "ifca", "ifca-clusters": 2, "clients-per-round": "=all",
                                    "batch-size": "=train-samples", "local-steps": 5},
                        "pfllib": None, "flbench": None, "ifca-authors": {"p": 2, "tau": 5}},
    # diagnostic: the authors' code started from this package's initial cluster models (ifca_launch.py --package-init)
    "ifca-full-batch-authors-pkg-init": {"package": None, "ifca-authors": {"p": 2, "tau": 5}, "ifca_flags": ["--package-init"]},
    "cfl": {"package": {"method": "cfl", "cfl-eps1": 0.4, "cfl-eps2": 1.6}, "pfllib": None,
            "flbench": ["method=cfl", "+cfl.eps_1=0.4", "+cfl.eps_2=1.6"]},
    "fedproto": {"package": {"method": "fedproto", "fedproto-lambda": 1.0}, "pfllib": ["-algo", "FedProto", "-lam", "1"],
                 "flbench": ["method=fedproto", "+fedproto.lamda=1"]},
    # diagnostic: this package's FedProto with the references' unweighted prototype mean (harness-side patch)
    "fedproto-pkg-unweighted": {"package": {"method": "fedproto", "fedproto-lambda": 1.0, "_diagnostic": "fedproto-unweighted"},
                                "pfllib": None, "flbench": None},
    "feddyn": {"package": {"method": "feddyn", "feddyn-alpha": 0.01}, "pfllib": ["-algo", "FedDyn", "-al", "0.01"],
               "flbench": ["method=feddyn", "+feddyn.alpha=0.01"]},
    "moon": {"package": {"method": "moon", "moon-mu": 1.0, "moon-tau": 0.5}, "pfllib": ["-algo", "MOON", "-mu", "1", "-tau", "0.5"],
             "flbench": ["method=moon", "+moon.mu=1", "+moon.tau=0.5"]},
    # α starts at 0.5 in all three (PFLlib's -al default is 1.0); α's step: this package's apfl-alpha-lr (0.02),
    # the references step it with the lr (0.05) by their own rule (README.md)
    "apfl": {"package": {"method": "apfl", "apfl-alpha-init": 0.5}, "pfllib": ["-algo", "APFL", "-al", "0.5"],
             "flbench": ["method=apfl", "+apfl.alpha=0.5"]},
    # diagnostics: this package's APFL step with FL-bench's reading of it, in parts (run.py ``_apfl_reading``):
    # its optimizer steps (w stepped twice with one gradient; the mixture with w after its first step), its α rule
    # (FedTorch's, step = lr), both; and α held at 0.5 in both (apfl-alpha-lr 0, FL-bench adaptive_alpha 0)
    "apfl-pkg-flbench-steps": {"package": {"method": "apfl", "apfl-alpha-init": 0.5, "_diagnostic": "apfl-flbench-package"},
                               "pfllib": None, "flbench": None},
    "apfl-pkg-flbench-alpha": {"package": {"method": "apfl", "apfl-alpha-init": 0.5, "_diagnostic": "apfl-package-flbench"},
                               "pfllib": None, "flbench": None},
    "apfl-pkg-flbench-reading": {"package": {"method": "apfl", "apfl-alpha-init": 0.5, "_diagnostic": "apfl-flbench-flbench"},
                                 "pfllib": None, "flbench": None},
    "apfl-alpha-fixed": {"package": {"method": "apfl", "apfl-alpha-init": 0.5, "apfl-alpha-lr": 0.0}, "pfllib": None,
                         "flbench": ["method=apfl", "+apfl.alpha=0.5", "+apfl.adaptive_alpha=0"]},
    # --- methods whose package side comes later (run with --libs pfllib flbench until then). Hyperparameters that both
    # sides have are set to the same values (the papers', which this package's defaults follow); PFLlib's main.py flags
    # are shared by all its algorithms, and their defaults would crash FedCAC (-bt 0: serverCAC asserts beta >= 1),
    # switch off FedDBE's regularizer (-klw 0) and FedPHP's supervised loss (-lam 1: CE x (1 - lamda)); the rest stay
    # at each library's defaults (README.md)
    "fedcp": {"package": {"method": "fedcp", "fedcp-lambda": 5.0}, "pfllib": ["-algo", "FedCP", "-lam", "5"], "flbench": None},
    # like for like with PFLlib's FedCP, which uploads the mean of a client's personalized and the global head
    # (clientcp.py, hard-coded 0.5); the package's default uploads the personalized head (the paper)
    "fedcp-head-mix-half": {"package": {"method": "fedcp", "fedcp-lambda": 5.0, "fedcp-head-mix": 0.5}, "pfllib": None,
                            "flbench": None},
    # diagnostic: each client gets the global head and CPN of its last round, as PFLlib's (harness-side patch)
    "fedcp-pkg-stale-modules": {"package": {"method": "fedcp", "fedcp-lambda": 5.0, "_diagnostic": "fedcp-stale-modules"},
                                "pfllib": None, "flbench": None},
    # diagnostic: this package's FedCP evaluating with Gumbel noise in its policy, as PFLlib (harness-side patch)
    "fedcp-pkg-eval-gumbel": {"package": {"method": "fedcp", "fedcp-lambda": 5.0, "_diagnostic": "fedcp-eval-gumbel"},
                              "pfllib": None, "flbench": None},
    # diagnostic: PFLlib's FedCP with this package's four readings (pfllib_launch.py --cp-package-reading)
    "fedcp-pfllib-package-reading": {"package": None, "pfllib": ["-algo", "FedCP", "-lam", "5"],
                                     "pfllib_flags": ["--dnn-logits", "--cp-package-reading"], "flbench": None},
    # diagnostics: PFLlib with another torch seed (its main.py and every client's constructor seed torch with 0, so its
    # --seed alone varies only the clients sampled; pfllib_launch.py --torch-seed-is-seed); with seed 0, its plain row
    "fedcp-pfllib-torch-seeds": {"package": None, "pfllib": ["-algo", "FedCP", "-lam", "5"],
                                 "pfllib_flags": ["--dnn-logits", "--torch-seed-is-seed"], "flbench": None},
    "fedavg-pfllib-torch-seeds": {"package": None, "pfllib": ["-algo", "FedAvg"], "pfllib_flags": ["--dnn-logits", "--torch-seed-is-seed"],
                                  "flbench": None},
    # diagnostic: this package's FedCP with PFLlib's random conditional input until a client's first round (patch)
    "fedcp-pkg-random-context": {"package": {"method": "fedcp", "fedcp-lambda": 5.0, "_diagnostic": "fedcp-random-context"},
                                 "pfllib": None, "flbench": None},
    # diagnostic: this package's FedCP with all four of PFLlib's readings above at once (head mix 0.5 and the patches)
    "fedcp-pkg-pfllib-reading": {"package": {"method": "fedcp", "fedcp-lambda": 5.0, "fedcp-head-mix": 0.5,
                                             "_diagnostic": "fedcp-pfllib"}, "pfllib": None, "flbench": None},
    "gpfl": {"package": {"method": "gpfl", "gpfl-lambda": 0.01, "gpfl-mu": 0.1},
             "pfllib": ["-algo", "GPFL", "-lam", "0.01", "-mu", "0.1"], "flbench": None},
    "feddbe": {"package": {"method": "feddbe", "feddbe-kappa": 50.0, "feddbe-momentum": 0.1},
               "pfllib": ["-algo", "FedDBE", "-klw", "50", "-mo", "0.1"], "flbench": None},
    # diagnostics: κ = 0 in both (the PRBM alone, no mean regularization), and momentum 1 in both (the running mean,
    # and so the consensus, is each minibatch's mean)
    "feddbe-kappa0": {"package": {"method": "feddbe", "feddbe-kappa": 0.0, "feddbe-momentum": 0.1},
                      "pfllib": ["-algo", "FedDBE", "-klw", "0", "-mo", "0.1"], "flbench": None},
    "feddbe-mo1": {"package": {"method": "feddbe", "feddbe-kappa": 50.0, "feddbe-momentum": 1.0},
                   "pfllib": ["-algo", "FedDBE", "-klw", "50", "-mo", "1"], "flbench": None},
    "fedpac": {"package": {"method": "fedpac", "fedpac-lambda": 1.0}, "pfllib": ["-algo", "FedPAC", "-lam", "1"],
               "flbench": ["method=fedpac", "+fedpac.lamda=1"]},
    # diagnostics: the local work of each reference's FedPAC. PFLlib's client trains the head for an epoch, then the
    # body for `-ls` epochs (10 steps per round here, against the package's 5 with 1 head step); FL-bench's trains the
    # classifier in its first `train_classifier_round` (1) epochs and the body in the rest, so at local_epoch 1 its body
    # never trains. The package with PFLlib's steps, and FL-bench with a second (body) epoch
    "fedpac-pkg-pfllib-steps": {"package": {"method": "fedpac", "fedpac-lambda": 1.0, "local-steps": 10, "fedpac-head-steps": 5},
                                "pfllib": None, "flbench": None},
    "fedpac-flbench-two-epochs": {"package": None, "pfllib": None,
                                  "flbench": ["method=fedpac", "+fedpac.lamda=1", "common.local_epoch=2"]},
    "fedas": {"package": {"method": "fedas"}, "pfllib": ["-algo", "FedAS"], "flbench": ["method=fedas"]},
    # FL-bench's warm-up is a fraction of the rounds (0.5); the package's is a count (50: half of Synthetic's 100)
    "pfedsim": {"package": {"method": "pfedsim", "pfedsim-warmup-rounds": "=half-rounds"}, "pfllib": None,
                "flbench": ["method=pfedsim"]},
    "pfedla": {"package": {"method": "pfedla"}, "pfllib": None, "flbench": ["method=pfedla"]},
    # diagnostic (FL-bench only): its hypernetworks never step (hn_lr 0); FL-bench's clients load their stored model
    # over the aggregated one (all_model_params_personalized), so this run equals the pfedla row if they never mattered
    "pfedla-flbench-hn-lr0": {"package": None, "pfllib": None, "flbench": ["method=pfedla", "+pfedla.hn_lr=0"]},
    "elastic": {"package": {"method": "elastic"}, "pfllib": None, "flbench": ["method=elastic"]},
    # diagnostics (FL-bench only): on CPU every client's reply carries the same sensitivity tensor, so its ζ is τ for
    # every tensor; τ = 1 makes ζ = 1 (FedAvg on the 70 % trained on), sample_ratio 0.01 holds out 1 sample of 100
    "elastic-flbench-tau1": {"package": None, "pfllib": None, "flbench": ["method=elastic", "+elastic.tau=1"]},
    "elastic-flbench-tau1-sr001": {"package": None, "pfllib": None,
                                   "flbench": ["method=elastic", "+elastic.tau=1", "+elastic.sample_ratio=0.01"]},
    "elastic-flbench-sr001": {"package": None, "pfllib": None,
                              "flbench": ["method=elastic", "+elastic.sample_ratio=0.01"]},
    "fedcac": {"package": {"method": "fedcac", "fedcac-tau": 0.5, "fedcac-beta": 170},
               "pfllib": ["-algo", "FedCAC", "-tau", "0.5", "-bt", "170"], "flbench": None},
    # diagnostic: τ = 0 (no critical parameter) in both: each library's FedCAC is then its own FedAvg (PFLlib: every
    # mask 0, so `set_parameters` sends every client the global model; its overlaps are 0/0 = NaN and unused)
    "fedcac-tau0": {"package": {"method": "fedcac", "fedcac-tau": 0.0, "fedcac-beta": 170},
                    "pfllib": ["-algo", "FedCAC", "-tau", "0", "-bt", "170"], "flbench": None},
    "fedphp": {"package": {"method": "fedphp", "fedphp-mu": 0.9, "fedphp-lambda": 0.1},
               "pfllib": ["-algo", "FedPHP", "-mu", "0.9", "-lam", "0.1"], "flbench": None},
    # diagnostics: what each side evaluates. PFLlib's clients evaluate their `model` (serverphp.py: send_models gives
    # every client the global model, the sampled ones train, then evaluate): pfllib_launch.py --php-eval-hpm makes
    # them evaluate their HPM (model_p), as this package does; and this package's FedPHP evaluating the global model
    # it receives instead of its HPM (harness-side patch, `_diagnostic`)
    "fedphp-pfllib-eval-hpm": {"package": None, "pfllib": ["-algo", "FedPHP", "-mu", "0.9", "-lam", "0.1"],
                               "pfllib_flags": ["--dnn-logits", "--php-eval-hpm"], "flbench": None},
    "fedphp-pkg-eval-global": {"package": {"method": "fedphp", "fedphp-mu": 0.9, "fedphp-lambda": 0.1,
                                           "_diagnostic": "fedphp-eval-global"}, "pfllib": None, "flbench": None},
    "fedlc": {"package": {"method": "fedlc", "fedlc-tau": 1.0}, "pfllib": ["-algo", "FedLC", "-tau", "1"],
              "flbench": ["method=fedlc", "+fedlc.tau=1"]},
    # generator: noise 32, hidden 256, Adam lr 3e-4, 50 steps per round in all three (PFLlib's defaults: 512, 512,
    # 0.005, 1000)
    "fedgen": {"package": {"method": "fedgen"},
               "pfllib": ["-algo", "FedGen", "-nd", "32", "-hd", "256", "-glr", "0.0003", "-se", "50"],
               "flbench": ["method=fedgen", "+fedgen.hidden_dim=256"]},
    # diagnostics: FL-bench with every generator / client setting of this package's (the like-for-like flags of
    # fedgen.py's docstring; its teacher logits still from the global model's head); both without the generator's
    # terms on the clients (α = β = 0, FL-bench's floor 1e-4: FedAvg plus the server's generator training); this
    # package without the generator's Adam weight decay (PFLlib's and FL-bench's generator optimizers have none)
    "fedgen-flbench-like": {"package": None, "pfllib": None,
                            "flbench": ["method=fedgen", "+fedgen.ensemble_lr=0.0003", "+fedgen.gen_batch_size=32",
                                        "+fedgen.generative_alpha=10", "+fedgen.generative_beta=10",
                                        "+fedgen.ensemble_alpha=1", "+fedgen.ensemble_beta=0", "+fedgen.ensemble_eta=1",
                                        "+fedgen.noise_dim=32", "+fedgen.hidden_dim=256", "+fedgen.use_embedding=0",
                                        "+fedgen.coef_decay=0.98", "+fedgen.coef_decay_epoch=1",
                                        "+fedgen.train_generator_epoch=50", "+fedgen.min_samples_per_label=0"]},
    "fedgen-ab0": {"package": {"method": "fedgen", "fedgen-alpha": 0.0, "fedgen-beta": 0.0}, "pfllib": None,
                   "flbench": ["method=fedgen", "+fedgen.ensemble_lr=0.0003", "+fedgen.gen_batch_size=32",
                               "+fedgen.generative_alpha=0", "+fedgen.generative_beta=0",
                               "+fedgen.ensemble_alpha=1", "+fedgen.ensemble_beta=0", "+fedgen.ensemble_eta=1",
                               "+fedgen.noise_dim=32", "+fedgen.hidden_dim=256", "+fedgen.use_embedding=0",
                               "+fedgen.coef_decay=0.98", "+fedgen.coef_decay_epoch=1",
                               "+fedgen.train_generator_epoch=50", "+fedgen.min_samples_per_label=0"]},
    # diagnostic: α = β = 1 (the authors' 10, a tenth): on the image setting's CNN at lr 0.05 the full terms diverge
    "fedgen-ab1": {"package": {"method": "fedgen", "fedgen-alpha": 1.0, "fedgen-beta": 1.0}, "pfllib": None, "flbench": None},
    "fedgen-wd0": {"package": {"method": "fedgen", "fedgen-weight-decay": 0.0}, "pfllib": None, "flbench": None},
    # diagnostic: this package with PFLlib's reading (clientgen.py / servergen.py): client loss CE + CE(h(G(ŷ)), ŷ) with
    # weight 1, no decay, B̂ = 20, no latent (β) term; generator without weight decay or diversity loss
    "fedgen-pkg-pfllib-reading": {"package": {"method": "fedgen", "fedgen-alpha": 1.0, "fedgen-beta": 0.0, "fedgen-decay": 1.0,
                                              "fedgen-batch-size": 20, "fedgen-weight-decay": 0.0, "fedgen-diversity": 0.0},
                                  "pfllib": None, "flbench": None},
    # diagnostics: μ = 0 in all three (MOON's code path without the contrastive term: FedAvg with each library's
    # client sample stream), and the references at their own defaults (PFLlib main.py: -mu 0, -tau 1.0;
    # FL-bench: mu 5, tau 0.5; this package's defaults are the moon row's μ 1, τ 0.5)
    "moon-mu0": {"package": {"method": "moon", "moon-mu": 0.0, "moon-tau": 0.5}, "pfllib": ["-algo", "MOON", "-mu", "0", "-tau", "0.5"],
                 "flbench": ["method=moon", "+moon.mu=0", "+moon.tau=0.5"]},
    "moon-lib-defaults": {"package": None, "pfllib": ["-algo", "MOON"], "flbench": ["method=moon"]},
    "knnper": {"package": {"method": "knnper", "knnper-k": 5, "knnper-lambda": 0.5, "knnper-scale": 1.0}, "pfllib": None,
               "flbench": ["method=knnper", "+knnper.k=5", "+knnper.weight=0.5", "+knnper.scale=1"]},
}


def _evaluate_ala_output() -> None:
    """Diagnostic only: a FedALA client evaluates what PFLlib evaluates (``serverala.py``: ``send_models`` runs ALA
    for every client, then ``evaluate``): the current global model with its top layer mixed with the client's
    local one by its stored weights W_i (``θ_i + (Θ − θ_i) ⊙ W_i``), instead of its model after local training."""
    import copy

    import torch

    import flower_pfl.methods.fedala as fedala

    def evaluation_model(cls: Any, model: Any, config: Any, state: Any, train: Any, test: Any) -> tuple[Any, dict]:
        local = copy.deepcopy(model)
        kept = fedala.stored(state, fedala.WEIGHTS_STATE)
        if not fedala.load_stored(local, state, fedala.LOCAL_STATE) or kept is None:
            return model, {}
        names = fedala.higher_layers(model, 1)
        received, own = dict(model.named_parameters()), dict(local.named_parameters())
        flat = kept[0].split([received[n].numel() for n in names])
        weights = {n: w.view_as(received[n]) for n, w in zip(names, flat)}
        with torch.no_grad():
            for n, t in fedala.ala_init({n: own[n] for n in names}, {n: received[n].detach().clone() for n in names}, weights).items():
                received[n].copy_(t)
        return model, {}

    fedala.FedALAClient.evaluation_model = classmethod(evaluation_model)  # type: ignore[method-assign,assignment]


def _apfl_reading(steps: str, alpha: str) -> None:
    """Diagnostic only: this package's APFL client step with parts of FL-bench's reading (``src/client/apfl.py``):
    ``steps == "flbench"``: one optimizer over both models, zeroed once per minibatch, stepped twice, so ``w`` takes
    its step twice with the same gradient (``w ← w − 2η ∇f(w)``), and the mixture that trains ``v`` uses ``w``
    after its first step; ``alpha == "flbench"``: α by FedTorch's rule as FL-bench writes it (after both steps,
    ``α ← clip(α − lr (<v − w, α ∇_v + (1 − α) ∇_w> + 0.02 α), 0, 1)``, ``∇_v`` the mixture loss's gradient, ``∇_w``
    the global loss's, the step size the setting's lr). ``"package"`` keeps this package's part."""
    import torch

    import flower_pfl.methods.apfl as apfl

    def train_step(self: Any, model: Any, next_batch: Any, lr: float) -> float:
        x, y = next_batch()
        w_params, v_params = apfl.trainable(model), apfl.trainable(self.personal)
        self.personal.train()
        out_w = model(x)
        loss = self.loss_fn(out_w, y)
        grads = torch.autograd.grad(loss, w_params)
        out_w = out_w.detach()  # this package: the mixture uses w before its step
        with torch.no_grad():
            for p, g in zip(w_params, grads):
                p.sub_(lr * g)
            if steps == "flbench":
                out_w = model(x)  # FL-bench: w after its first step
        a = torch.tensor(float(self.alpha), requires_grad=True)
        mixed = self.loss_fn(a * self.personal(x) + (1 - a) * out_w, y)
        *v_grads, a_grad = torch.autograd.grad(mixed, [*v_params, a])
        with torch.no_grad():
            for p, g in zip(v_params, v_grads):
                p.sub_(lr * g)
            if steps == "flbench":
                for p, g in zip(w_params, grads):  # the second optimizer.step(): w's gradient is still there
                    p.sub_(lr * g)
        if alpha == "flbench":
            with torch.no_grad():
                inner = sum(float((v - w).flatten() @ (self.alpha * gv + (1 - self.alpha) * gw).flatten())
                            for v, w, gv, gw in zip(v_params, w_params, v_grads, grads))
            self.alpha = float(min(1.0, max(0.0, self.alpha - lr * (inner + 0.02 * self.alpha))))
        else:
            self.alpha = float(min(1.0, max(0.0, self.alpha - self.alpha_lr * float(a_grad))))
        return float(loss.detach())

    apfl.APFLClient.train_step = train_step  # type: ignore[method-assign]


def _fedcp_stale_modules() -> None:
    """Diagnostic only: each FedCP client gets the global head and CPN of the last round it took part in (the
    initial ones before), as PFLlib's server hands them only to the round's participants, after aggregating
    (`servercp.py` `global_head`, `global_cs`), while every client gets each round's feature extractor."""
    import dataclasses

    import flower_pfl.methods.fedcp as fedcp

    kept: dict[Any, bytes] = {}
    train, evaluate, aggregate = fedcp.FedCP.train_instructions, fedcp.FedCP.evaluation_instructions, fedcp.FedCP.aggregate

    def own(self, instructions):
        kept.setdefault("initial", self.side_settings()[fedcp.MODULES])
        return [dataclasses.replace(i, config={**i.config, fedcp.MODULES: kept.get(i.client_id, kept["initial"])})
                for i in instructions]

    def train_instructions(self, server_round, sampled, others):
        return own(self, train(self, server_round, sampled, others))

    def evaluation_instructions(self, server_round, ids):
        return own(self, evaluate(self, server_round, ids))

    def aggregated(self, server_round, replies):
        aggregate(self, server_round, replies)
        for reply in replies:
            kept[reply.client_id] = self.side_settings()[fedcp.MODULES]

    fedcp.FedCP.train_instructions = train_instructions  # type: ignore[method-assign]
    fedcp.FedCP.evaluation_instructions = evaluation_instructions  # type: ignore[method-assign]
    fedcp.FedCP.aggregate = aggregated  # type: ignore[method-assign]


def _fedcp_eval_gumbel() -> None:
    """Diagnostic only: FedCP's clients evaluate with the Gumbel-Softmax policy, noise and all, as PFLlib's do (its
    `ConditionalSelection.forward` calls `F.gumbel_softmax` in eval mode too)."""
    import torch

    import flower_pfl.methods.fedcp as fedcp

    def noisy(self, x):
        generator = torch.Generator().manual_seed(len(x))
        return fedcp.separated_logits(self.model, self.modules_, x, self.context,
                                      lambda shape: fedcp.gumbel(shape, generator, x.device))[0]

    fedcp.Separated.forward = noisy  # type: ignore[method-assign]


def _fedcp_random_context() -> None:
    """Diagnostic only: a FedCP client whose personalized head has not trained yet takes PFLlib's initial conditional
    input instead of its head's, the same uniform random vector for every client (`clientcp.py` draws
    `torch.rand(1, in_dim)` right after `clientbase.py` seeds torch with 0), until its first round ends (`set_head_g`)."""
    import torch

    import flower_pfl.methods.fedcp as fedcp

    from_head, initial = fedcp.conditional_input, list[torch.Tensor]()

    def conditional_input(model):
        weight = fedcp.head_module(model).weight.detach()
        if not initial:  # the first client of round 1: every head is still the initial one
            initial.append(weight.clone())
        if torch.equal(weight, initial[0]):
            return torch.rand(weight.shape[1], generator=torch.Generator().manual_seed(0)).to(weight)
        return from_head(model)

    fedcp.conditional_input = conditional_input


#: the FedCP diagnostics: PFLlib's readings, one at a time and together (with `fedcp-head-mix` 0.5 in the spec)
FEDCP_READINGS: dict[str, tuple[Callable[[], None], ...]] = {
    "fedcp-stale-modules": (_fedcp_stale_modules,), "fedcp-eval-gumbel": (_fedcp_eval_gumbel,),
    "fedcp-random-context": (_fedcp_random_context,),
    "fedcp-pfllib": (_fedcp_stale_modules, _fedcp_eval_gumbel, _fedcp_random_context),
}


def alpha_summary(alphas: list[float]) -> dict[str, float]:
    """APFL's mixing weights α at the end of a run, over the clients that trained (also in flbench_launch.py)."""
    s = sorted(alphas)
    return {"clients": len(s), "mean": sum(s) / len(s), "min": s[0], "median": s[len(s) // 2], "max": s[-1]}


def package_job(setting: str, overrides: dict[str, Any], out: Path, seed: int) -> None:
    """(In a child process) run this package in-process and write the accuracies to ``out``."""
    import logging

    import torch

    from server_apps.inprocess import run_in_process

    torch.set_num_threads(1)
    logging.getLogger("flwr").setLevel(logging.WARNING)
    overrides = dict(overrides)
    if (diagnostic := overrides.pop("_diagnostic", None)) == "fedproto-unweighted":
        # diagnostic only: FedProto's global prototypes as the unweighted mean over the clients holding a class
        # (PFLlib's / FL-bench's / the authors' aggregation) instead of this package's sample-weighted mean
        import flower_pfl.methods.fedproto as fedproto

        weighted = fedproto.aggregate_prototypes
        fedproto.aggregate_prototypes = lambda w, protos: weighted((w > 0).to(w.dtype), protos)
    if diagnostic == "fedala-eval-ala":
        _evaluate_ala_output()
    for reading in FEDCP_READINGS.get(diagnostic or "", ()):
        reading()
    if diagnostic == "fedphp-eval-global":
        # diagnostic only: a FedPHP client evaluates the global model it receives (as PFLlib's clients do for the
        # rounds they sit out), not its HPM
        import flower_pfl.methods.fedphp as fedphp

        fedphp.FedPHPClient.evaluated_state = None  # type: ignore[misc]
    if diagnostic and diagnostic.startswith("apfl-"):  # apfl-<steps>-<alpha>, each "package" or "flbench"
        _apfl_reading(*diagnostic.split("-")[1:])
    alphas: dict[int, float] = {}  # APFL: each client's α after its last round (by its node's context.state)
    if overrides.get("method") == "apfl":
        import flower_pfl.methods.apfl as apfl

        end_round = apfl.APFLClient.end_round

        def keep_alpha(self: Any, model: Any, inputs: Any = None) -> dict[str, bytes]:
            alphas[id(getattr(self.state, "records", self.state))] = self.alpha
            return end_round(self, model, inputs)

        apfl.APFLClient.end_round = keep_alpha  # type: ignore[method-assign]
    # The exported data are those of the setting's seed; a run with another seed (client sample, initial
    # model, minibatches) keeps them, as PFLlib's and FL-bench's seeds do: the data has the setting's seed.
    rc = run_config(setting) | {"seed": seed, "data-seed": run_config(setting)["seed"],
                                "output-dir": str(out.parent / "package-results"), "checkpoint-every": 0}
    n = SETTINGS[setting]["num_nodes"]
    computed = {"=lr": rc["lr"], "=1+n/4": int(1 + n / 4), "=all": n,  # values that follow the setting
                "=train-samples": rc["train-samples-per-client"], "=half-rounds": rc["num-rounds"] // 2}
    rc |= {k: computed.get(v, v) if isinstance(v, str) else v for k, v in overrides.items()}
    t0 = time.time()
    folder = run_in_process(rc, num_clients=SETTINGS[setting]["num_nodes"])
    seconds = time.time() - t0
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    ev = [r for r in rows if r.get("phase") == "evaluate" and "accuracy-mean" in r]
    result = {
        "library": "package", "run_config": rc, "diagnostic": diagnostic, "seconds": round(seconds, 1), "results_dir": str(folder),
        "rounds": [r["round"] for r in ev], "accuracy_weighted": [r["accuracy"] for r in ev],
        "accuracy_mean": [r["accuracy-mean"] for r in ev],
    }
    if alphas:
        result["alpha"] = alpha_summary(list(alphas.values()))
    # the method's other figures (global-accuracy, prototype-accuracy, ...), sample-weighted, per evaluation
    for key in sorted({k for r in ev for k in r if k.endswith("accuracy") and k != "accuracy"}):
        result[f"{key}_weighted"] = [r.get(key) for r in ev]
    result |= {"final_weighted": result["accuracy_weighted"][-1], "best_weighted": max(result["accuracy_weighted"]),
               "final_mean": result["accuracy_mean"][-1], "best_mean": max(result["accuracy_mean"])}
    out.write_text(json.dumps(result, indent=1))


def pfllib_argv(setting: str, method_args: list[str]) -> list[str]:
    rc, spec = run_config(setting), SETTINGS[setting]
    n = spec["num_nodes"]
    common = ["-data", spec["pfllib"]["dataset"], "-m", spec["pfllib"]["model"], "-ncl", "10",
              "-nc", str(n), "-jr", str(rc["clients-per-round"] / n), "-gr", str(rc["num-rounds"]),
              "-ls", "1", "-lbs", str(rc["batch-size"]), "-lr", str(rc["lr"]), "-eg", str(rc["eval-every"])]
    return [*common, *method_args]  # argparse keeps the last value: the method's settings win


def flbench_overrides(setting: str, method_args: list[str], seed: int) -> list[str]:
    rc, spec = run_config(setting), SETTINGS[setting]
    n = spec["num_nodes"]
    common = [f"dataset.name={spec['flbench']['dataset']}", f"model.name={spec['flbench']['model']}",
            "model.use_torchvision_pretrained_weights=false", f"optimizer.lr={rc['lr']}", f"common.seed={seed}",
            f"common.join_ratio={rc['clients-per-round'] / n}", f"common.global_epoch={rc['num-rounds']}",
            "common.local_epoch=1", f"common.batch_size={rc['batch-size']}",
            f"common.test.client.interval={rc['eval-every']}", "common.use_cuda=false",
            "common.client_side_evaluation=false", "common.save_learning_curve_plot=false",
            "common.save_metrics=false", "common.verbose_gap=100000"]
    key = lambda arg: arg.lstrip("+").split("=", 1)[0]
    mine = {key(x) for x in method_args}
    return [*method_args, *[x for x in common if key(x) not in mine]]  # Hydra refuses a key given twice


def ifca_config(setting: str, method_config: dict[str, Any]) -> dict[str, Any]:
    """The IFCA authors' config keys (their ``config.json``, overridden by ``--config-override``): m = m_test =
    the clients, the setting's rounds and lr; the method's entry sets p (clusters) and tau (local steps)."""
    rc, n = run_config(setting), SETTINGS[setting]["num_nodes"]
    return {"m": n, "m_test": n, "n": rc["train-samples-per-client"], "h1": rc.get("hidden-units", 20),
            "num_epochs": rc["num-rounds"], "lr": rc["lr"], "batch_size": rc["train-samples-per-client"], **method_config}


def run_one(setting: str, method: str, lib: str, seed: int, timeout: float, extra: list[str]) -> dict | None:
    spec = METHODS[method].get(lib)
    if spec is None:
        return None
    folder = SCRATCH / "runs" / setting
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"{method}-{lib}-seed{seed}.json"
    if lib == "package":
        cmd = [sys.executable, str(Path(__file__)), "--package-job", json.dumps(spec), "--setting", setting,
               "--out", str(out), "--seed", str(seed)]
    elif lib == "pfllib":
        flags = METHODS[method].get("pfllib_flags", SETTINGS[setting]["pfllib"].get("flags", []))
        cmd = [str(PFLLIB_PYTHON), str(HERE / "pfllib_launch.py"), "--root", str(PFLLIB_ROOT), "--out", str(out),
               "--seed", str(seed), *flags, "--", *pfllib_argv(setting, spec)]
    elif lib == "ifca-authors":
        cmd = [sys.executable, str(HERE / "ifca_launch.py"), "--root", str(IFCA_ROOT),
               "--data", str(PFLLIB_ROOT / "dataset" / SETTINGS[setting]["pfllib"]["dataset"]),
               "--manifest", str(SCRATCH / "export" / f"{setting}.json"), "--out", str(out), "--seed", str(seed),
               "--eval-every", str(run_config(setting)["eval-every"]), *METHODS[method].get("ifca_flags", []), "--",
               "--config-override", json.dumps(ifca_config(setting, spec))]
    else:
        flags = METHODS[method].get("flbench_flags", [])
        cmd = [str(FLBENCH_PYTHON), str(HERE / "flbench_launch.py"), "--root", str(FLBENCH_ROOT), "--out", str(out),
               *flags, *extra, "--", *flbench_overrides(setting, spec, seed)]
    out.unlink(missing_ok=True)
    t0 = time.time()
    err = folder / f"{method}-{lib}-seed{seed}.stderr"
    with open(err, "w") as fh:
        try:
            proc = subprocess.run(cmd, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout,
                                  env={**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"})
        except subprocess.TimeoutExpired:
            print(f"  {lib}: TIMED OUT after {timeout:.0f} s", flush=True)
            return {"library": lib, "failed": True, "timeout_s": timeout, "stderr": str(err), "command": cmd}
    if proc.returncode != 0 or not out.exists():
        tail = err.read_text()[-1500:]
        print(f"  {lib}: FAILED (exit {proc.returncode}); see {err}\n{tail}", flush=True)
        return {"library": lib, "failed": True, "exit": proc.returncode, "stderr": str(err), "tail": tail[-600:]}
    r = json.loads(out.read_text())
    r["command"] = cmd
    print(f"  {lib:8s} final {100 * r['final_weighted']:6.2f}  best {100 * r['best_weighted']:6.2f}  "
          f"({time.time() - t0:.0f} s)", flush=True)
    return r


def record(setting: str, method: str, lib: str, result: dict, seed: int) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{setting}.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data.setdefault("setting", setting)
    data["run_config"] = run_config(setting)
    data["num_nodes"] = SETTINGS[setting]["num_nodes"]
    keep = {k: v for k, v in result.items() if k not in ("run_config",)}
    data.setdefault("methods", {}).setdefault(method, {})[f"{lib}" + ("" if seed == 0 else f"-seed{seed}")] = keep
    path.write_text(json.dumps(data, indent=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--setting", choices=list(SETTINGS), default="synthetic")
    p.add_argument("--methods", nargs="*", default=[])
    p.add_argument("--libs", nargs="*", choices=LIBS, default=list(LIBS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--flbench-extra", nargs="*", default=[], help="extra flags for flbench_launch.py (e.g. --native-rescale)")
    p.add_argument("--record-as", help="record under this method name (default: the method's)")
    p.add_argument("--table", action="store_true", help="write results/table.md from results/*.json")
    p.add_argument("--package-job", help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.package_job:
        package_job(a.setting, json.loads(a.package_job), a.out, a.seed)
        return
    if a.table:
        from benchmarks.reference.table import write_table

        print(write_table({m: {lib for lib in LIBS if spec.get(lib) is not None} for m, spec in METHODS.items()}))
        return
    for method in a.methods:
        print(f"{a.setting} / {method}", flush=True)
        for lib in a.libs:
            r = run_one(a.setting, method, lib, a.seed, a.timeout, [f"--{x.lstrip('-')}" for x in a.flbench_extra])
            if r is not None:
                record(a.setting, a.record_as or method, lib, r, a.seed)


if __name__ == "__main__":
    main()
