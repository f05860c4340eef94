"""The data sets of the experiments, one module each, found by name (``registry``), like a method: its
``dataset`` value, its run-config keys, its sample shape and kind, and how it is read from its local files
or the hub (``base.DataSet``). ``own`` reads a researcher's data by import path.
May import: ``flower_pfl.engine``, ``flower_pfl.experiment.data``.
"""
