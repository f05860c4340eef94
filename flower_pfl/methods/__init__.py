"""The methods of flower-pfl, one module each, and the aggregation kernels they share.

Each method module declares a method: its hyperparameters (defaults, run-config keys, allowed
values, documentation), its server algorithm and its client algorithm (see ``base``). ``registry`` finds
them; the run config, both Flower APIs' strategies and the ClientApp read the registry.
``attention`` holds the vectorized aggregation math (similarities, attention, FedAMP's weights);
``all_clients_train`` FedMCSA's Algorithm 1, which the methods with a model per client offer.
May import: ``flower_pfl.engine``.
"""
