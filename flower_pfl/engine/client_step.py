"""Renamed: ``flower_pfl.engine.client_algorithm`` (``ClientStep`` is ``ClientAlgorithm``); the old
names import for one release, with a warning."""

from flower_pfl.engine.deprecated import renamed

__getattr__ = renamed(__name__, {"ClientStep": ("flower_pfl.engine.client_algorithm", "ClientAlgorithm")},
                      moved_to="flower_pfl.engine.client_algorithm")
