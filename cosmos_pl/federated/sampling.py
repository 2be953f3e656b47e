"""Clients sampled per round (``clients_per_round``): which clients take part in a round.

An unsampled client neither trains nor uploads that round and keeps its model; every client is still scored in
every evaluated round. The draw depends on (seed, round) only, so a resumed run, or the same config on another
machine, samples the same clients.
"""

from __future__ import annotations

from typing import Optional, Union

import numpy as np

from cosmos_pl.errors import ConfigError

__all__ = ["check_clients_per_round", "round_size", "sampled_clients"]

_STREAM = 0x5EED  # keeps these draws apart from every other use of the seed


def check_clients_per_round(value: Optional[Union[int, float]], num_clients: int) -> None:
    """Raises ConfigError: ``clients_per_round`` is not null, a count 1..N (an integer) or a fraction in (0, 1]."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"clients_per_round={value!r}: give a count (e.g. 10), a fraction (e.g. 0.5) or null "
                          "(every client, every round)")
    if isinstance(value, int) and not 1 <= value <= num_clients:
        raise ConfigError(f"clients_per_round={value}: a count must be 1..data.num_clients={num_clients}; give a "
                          "smaller count, a fraction such as 0.5, or null (every client)")
    if isinstance(value, float) and not 0 < value <= 1:
        raise ConfigError(f"clients_per_round={value}: a fraction must be in (0, 1]; give e.g. 0.5, a count such as "
                          "10, or null (every client)")


def round_size(value: Optional[Union[int, float]], num_clients: int) -> int:
    """How many of ``num_clients`` take part in a round: all (null), the count, or round(fraction x N), at least 1
    (Python's round: half to even, 0.5 x 5 = 2.5 -> 2)."""
    if value is None:
        return num_clients
    if isinstance(value, int):
        return value
    return max(1, min(num_clients, round(value * num_clients)))


def sampled_clients(num_clients: int, value: Optional[Union[int, float]], seed: int, rnd: int) -> list[int]:
    """The clients taking part in round ``rnd`` (sorted ids): every client with ``value`` null, else
    :func:`round_size` of them drawn without replacement by a generator seeded from (seed, rnd)."""
    k = round_size(value, num_clients)
    if k >= num_clients:
        return list(range(num_clients))
    rng = np.random.default_rng([_STREAM, seed, rnd])
    return sorted(int(i) for i in rng.choice(num_clients, size=k, replace=False))
