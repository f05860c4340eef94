"""A run as it goes and after: the results folder (``results``: config, per-round metrics, client
evaluations, models, summary), the run's figures (``summary``), its console lines (``progress``,
``quiet``) and the tensor files its checkpoints and client state are written in (``tensor_files``).
May import: ``flower_pfl.engine``, ``flower_pfl.methods``, ``flower_pfl.experiment``, ``flower_pfl.reports``.
"""
