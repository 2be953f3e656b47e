"""Federated algorithms over one runner loop: COSMOS and its baselines, chosen by class path or short name.

| name | class | scored model |
| --- | --- | --- |
| cosmos | :class:`COSMOS` | cluster teacher h_pi(i) |
| local | :class:`LocalOnly` | client f_i |
| fedmd | :class:`FedMD` | client f_i |
| fedct | :class:`FedCT` | client f_i |
| comet | :class:`COMET` | client f_i |
| fedavg | :class:`FedAvg` | client f_i (the global model) |
| ditto | :class:`Ditto` | client f_i (its personal model v_i) |
| fedbabu | :class:`FedBABU` | client f_i (the global model fine-tuned on D_i) |
| fedselect | :class:`FedSelect` | client f_i (after LocalAlt, before the next merge) |
| pfedck | :class:`PFedCK` | client f_i (its personalized model phi_i) |
| pfedhn | :class:`PFedHN` | client f_i (the weights its hypernetwork generated) |
"""

from __future__ import annotations

import difflib

from cosmos_pl.algorithms.base import Algorithm, FederationContext, ServerResult
from cosmos_pl.algorithms.comet import COMET
from cosmos_pl.algorithms.cosmos import COSMOS
from cosmos_pl.algorithms.ditto import Ditto
from cosmos_pl.algorithms.fedavg import FedAvg
from cosmos_pl.algorithms.fedbabu import FedBABU
from cosmos_pl.algorithms.fedct import FedCT
from cosmos_pl.algorithms.fedmd import FedMD
from cosmos_pl.algorithms.fedselect import FedSelect
from cosmos_pl.algorithms.local import LocalOnly
from cosmos_pl.algorithms.pfedck import PFedCK
from cosmos_pl.algorithms.pfedhn import PFedHN
from cosmos_pl.errors import ConfigError

__all__ = ["Algorithm", "FederationContext", "ServerResult", "COSMOS", "LocalOnly", "FedMD", "FedCT", "COMET",
           "FedAvg", "Ditto", "FedBABU", "FedSelect", "PFedCK", "PFedHN", "ALGORITHMS", "algorithm_class"]

ALGORITHMS: dict[str, type[Algorithm]] = {cls.name: cls for cls in (COSMOS, LocalOnly, FedMD, FedCT, COMET, FedAvg, Ditto,
                                                                      FedBABU, FedSelect, PFedCK, PFedHN)}


def algorithm_class(name: str, key: str = "algorithm") -> type[Algorithm]:
    """The class of a short algorithm name (case-insensitive); ``key`` is the setting that gave it.

    Raises:
        ConfigError: an unknown name, suggesting the closest valid one and listing all.
    """
    short = name.strip().lower()
    if short in ALGORITHMS:
        return ALGORITHMS[short]
    close = difflib.get_close_matches(short, list(ALGORITHMS), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ConfigError(f"{key}={name!r}: unknown algorithm; {hint}valid names are {', '.join(ALGORITHMS)}")
