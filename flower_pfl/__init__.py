"""flower-pfl: personalized federated learning methods as Flower strategies.

This package holds everything that does not need Flower, in layers that import only downward:

- ``engine``: flat models and their layout, the per-client model store, sampling, reply checks,
  the server algorithm a method builds on and the client algorithm its clients run;
- ``methods``: one module per method (its hyperparameters, server and client algorithms) and the
  aggregation kernels, found by ``methods.registry``;
- ``experiment``: an experiment's run config, data sets, partitions and models;
- ``reports``: figures and diagnostics of a run;
- ``run``: a run's results folder, summary, console lines and tensor files;
- ``tools``: the command-line tools (sweeps, comparisons, the local SuperLink, credentials),
  which drive the apps and so sit above them.

``strategies``, ``client_apps`` and ``server_apps`` (beside this package) wire the layers into
Flower; ``tests/test_architecture.py`` fails on an import that points upward or closes a cycle.
"""

__version__ = "0.1.0"
