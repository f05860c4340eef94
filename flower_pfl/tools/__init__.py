"""Command-line tools: sweeps of methods × settings × seeds (``sweep``, ``sweep_grid``,
``sweep_flwr``), tables and overlays of finished runs (``compare``), the local SuperLink's status
and stop (``superlink``), and TLS certificates and SuperNode keys for deployments (``credentials``).
``python -m flower_pfl <tool>`` runs one. The top layer: may import everything, the apps included.
"""
