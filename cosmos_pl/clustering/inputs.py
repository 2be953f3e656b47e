"""What the server's clustering step reads from the uploads: the one place COSMOS and the benchmarks build it.

From the uploads ``[N, n, M]`` (Section 4.1): the public samples read (all of U, or a fixed subsample above the
work budget of :mod:`~cosmos_pl.clustering.distances`), each client's spread (which names the clients that upload
one distribution for every sample), the confidence floor (:mod:`~cosmos_pl.clustering.confidence`) and the client
distances. Nothing here reads group ids.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from cosmos_pl.clustering.confidence import check_confidence_floor, temper_to_floor
from cosmos_pl.clustering.distances import (CONSTANT_SPREAD, EXACT_BUDGET, check_pseudo_labels, pairwise_distances,
                                           public_subsample, spread)

__all__ = ["ClusterInputs", "cluster_inputs"]


@dataclass
class ClusterInputs:
    """The clustering step's inputs, rows in the order of the uploads.

    Attributes:
        distances: ``[N, N]`` client distances (on the re-tempered uploads where a floor applies).
        samples: how many public samples they were computed on.
        uninformative: rows whose spread is under ``CONSTANT_SPREAD`` (one distribution for every sample).
        tempered: rows re-tempered to the confidence floor, with their exponent beta.
    """

    distances: np.ndarray
    samples: int
    uninformative: list[int] = field(default_factory=list)
    tempered: dict[int, float] = field(default_factory=dict)


def cluster_inputs(uploads: torch.Tensor, metric: str = "l1", confidence_floor: float = 0.0,
                   budget: float = EXACT_BUDGET) -> ClusterInputs:
    """The distances and client flags the clustering rules read (see the module docstring).

    Args:
        uploads: ``[N, n, M]`` float pseudo-labels, one row per client.
        metric: "l1" (paper), "l1_hard" or "l2" (:func:`~cosmos_pl.clustering.distances.pairwise_distances`).
        confidence_floor: the mean top probability clients under it are re-tempered to before the distances (0:
            none); ``l1_hard`` reads only the argmax, which tempering keeps, so it is skipped there.
        budget: the work budget of exact distances.

    Raises:
        ValueError: a wrong rank, an unknown metric or a floor outside [0, 1) (whatever the metric).
        DataError: an empty U.
        DivergenceError: non-finite pseudo-labels (naming the clients).
    """
    check_confidence_floor(confidence_floor)  # whatever the metric, though l1_hard does not use it
    if uploads.dim() != 3:
        check_pseudo_labels(uploads, metric)  # raises, naming the shape
    read = public_subsample(uploads, budget)
    check_pseudo_labels(read, metric)  # on the samples read: a scan of all of a large U costs seconds
    flat = np.flatnonzero(spread(read, budget=math.inf) < CONSTANT_SPREAD).tolist()  # before any re-tempering
    # a subsample is already a copy of the uploads: re-tempered where it lies
    compared, tempered = ((read, {}) if metric == "l1_hard" else
                          temper_to_floor(read, confidence_floor, in_place=read is not uploads))
    distances = pairwise_distances(compared, metric, budget=math.inf)
    return ClusterInputs(distances, int(read.shape[1]), flat, tempered)
