"""The engine every method runs on, free of Flower (it imports only torch, numpy and itself).

``layout`` (flat models), ``store`` (one model per client), ``sampling``, ``params`` (how a method
declares a hyperparameter), ``reply_checks`` (what the server refuses), ``server_step`` (the two
bases of a method's server side), ``method_server`` (a server algorithm with sampling, ranks and reply
checks), ``client_contract`` (what clients owe a method, and what is said when they do not),
``client_step`` (the local-training loop and its hooks), ``all_clients_train`` (FedMCSA's
Algorithm 1 for any method with a model per client), ``minibatches``, ``evaluation``,
``client_metrics``, ``attention_log`` and ``wire`` (tensors as bytes).
"""
