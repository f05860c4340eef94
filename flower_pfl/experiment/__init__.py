"""An experiment: its run config (``config``: every key, its default and allowed values), the data
sets and their per-client partitions (``data``), the models (``models``) and what a run builds from
the config (``build``: a client's data, the model, the starting arrays, the device).
May import: ``flower_pfl.engine``, ``flower_pfl.methods``.
"""
