"""Figures and diagnostics of a run: learning curves, client-by-client matrices (attention,
similarity, selection) and the statistics drawn beside them.
May import: ``flower_pfl.engine``, ``flower_pfl.methods``, ``flower_pfl.experiment``.
"""
