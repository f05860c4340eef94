"""Renamed: ``flower_pfl.engine.server_algorithm`` (``ServerStep``, ``PersonalizedStep`` and
``GlobalModelStep`` are ``ServerAlgorithm``, ``PersonalizedAlgorithm`` and ``GlobalModelAlgorithm``);
the old names import for one release, with a warning."""

from flower_pfl.engine.deprecated import renamed

_NEW = "flower_pfl.engine.server_algorithm"
__getattr__ = renamed(__name__, {"ServerStep": (_NEW, "ServerAlgorithm"), "PersonalizedStep": (_NEW, "PersonalizedAlgorithm"),
                                 "GlobalModelStep": (_NEW, "GlobalModelAlgorithm")}, moved_to=_NEW)
