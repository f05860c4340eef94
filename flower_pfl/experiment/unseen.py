"""The clients that never train (FL-bench's user split, pFL-Bench's new clients, held-out domains): chosen by
partition id from the run config alone, so every layout, engine and resumed run has the same ones."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from flower_pfl.experiment.config import ConfigError, ExperimentConfig


def drawn_unseen(num_clients: int, share: float, seed: int) -> frozenset[int]:
    """``round(share · num_clients)`` partition ids (at least one where ``share > 0``, at most all but one), a
    seeded draw that depends on nothing but its arguments."""
    if share <= 0 or num_clients < 2:
        return frozenset()
    n = min(max(int(round(share * num_clients)), 1), num_clients - 1)
    return frozenset(int(i) for i in np.random.default_rng([seed, 5]).permutation(num_clients)[:n])


def held_out(domains: str, groups: Mapping[int, str]) -> frozenset[int]:
    """The partition ids whose domain (``groups``: partition id -> the domain or natural group its data come
    from) is one of the comma-separated ``domains``; a ``ConfigError`` names a domain no client has."""
    names = [d.strip() for d in domains.split(",") if d.strip()]
    if not names:
        return frozenset()
    known = sorted(set(groups.values()) - {""})
    if missing := [d for d in names if d not in known]:
        have = f"the clients' domains are {', '.join(known)}" if known else "the clients report no domain or natural group"
        raise ConfigError(f"run config 'unseen-domains' = {domains!r}: {', '.join(missing)} is no client's domain ({have})")
    return frozenset(pid for pid, group in groups.items() if group in names)


def unseen_clients(cfg: ExperimentConfig, num_clients: int, groups: Mapping[int, str]) -> frozenset[int]:
    """The partition ids that never train in a run of ``cfg`` over ``num_clients`` clients: ``unseen-fraction``'s
    draw and the clients of ``unseen-domains``; a ``ConfigError`` when no client would train."""
    unseen = drawn_unseen(num_clients, cfg.unseen_fraction, cfg.data_rng_seed) | held_out(cfg.unseen_domains, groups)
    if unseen and len(unseen) >= num_clients:
        raise ConfigError(f"run config 'unseen-fraction' = {cfg.unseen_fraction:g} and 'unseen-domains' = "
                          f"{cfg.unseen_domains!r} leave none of the {num_clients} clients to train")
    return unseen
