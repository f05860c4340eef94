"""The engine every method runs on, free of Flower (it imports only torch, numpy and itself).

``layout`` (flat models), ``store`` and ``disk_store`` (one model per client, in memory or on disk,
with ``undo_log`` for the disk store's snapshots), ``sampling``, ``params`` (how a method declares a
hyperparameter), ``reply_checks`` (what the server refuses), ``server_algorithm`` (the bases of a
method's server half), ``method_server`` (a server algorithm with sampling, ranks and reply checks),
``client_contract`` (what clients owe a method, and what is said when they do not),
``client_algorithm`` (a method's client half: the local-training loop and its hooks),
``minibatches``, ``evaluation``, ``client_metrics``, ``attention_log`` (diagnostics), ``model_split``,
``wire`` (tensors as bytes), ``wording`` (sentences built from counts), ``extras`` (optional parts) and ``deprecated`` (renamed names kept for a
release; ``client_step`` and ``server_step`` are such names).
"""
