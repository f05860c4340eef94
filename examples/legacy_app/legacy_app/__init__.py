"""A plain Flower app, legacy API (``server_fn`` / ``client_fn``), with FedAvg swapped for FedACS."""
