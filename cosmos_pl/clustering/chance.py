"""Whether a cut of the clients is better than chance would make it: the keep rule of ``b0: auto``.

A clustering's mean silhouette says little by itself: with many classes and weak clients every distance is large
and close to every other, so real groups may score 0.15, while a few strong clients in few groups make chance
cliques that score 0.4 (measured with the shuffles' cut searched over every K: 10 clients in 5 pairs, 0.56 against
0.30-0.42 by chance; planted groups of weak clients, 0.18-0.21 against 0.15-0.19 by chance). So the start cut is judged against **the same distances with no
grouping in them**:

- ``shuffles`` copies of the distance matrix with the N(N-1)/2 values above its diagonal permuted (kept symmetric):
  the same values, none of them tied to a group, so as many small distances as the data has, scattered;
- each clustered by the procedure that chose the start cut (average linkage, then the cut with the best mean
  silhouette, searched over 2 <= K <= the data's K: shuffled distances score their best with many tight pairs, a
  search the data's cut did not win by), so the choice of clusters is paid for;
- the cut is kept when ``(1 + the shuffles whose best mean silhouette reaches the data's) / (shuffles + 1) <=
  alpha``: a permutation test (at the defaults, 19 shuffles and alpha 0.05, the data must beat every shuffle; up to
  :data:`SMALL_N` clients 199 shuffles, of which at most 9 may reach it).

What counts as a clear structure is thus set by the distances at hand, not by a silhouette floor. The data's cut
was searched over every K and the shuffles' only up to it, so the test keeps structureless cuts somewhat more often
than ``alpha`` (measured: 4 of 20 shuffled matrices of 20 clients). Where N exceeds
:data:`NULL_CLIENTS`, each shuffle permutes the distances among a random :data:`NULL_CLIENTS` of the clients (the
start-cut search costs O(N^2) per cut tried); the shuffled best silhouettes barely moved with N (their medians
0.156 / 0.150 / 0.161 at 20 / 50 / 100 planted clients of overlap 1.0, measured with the search over every K; not
measured again for the search up to the data's K).

The permutations come from ``numpy.random.default_rng`` seeded with a checksum of the distances: the same distances
give the same verdict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import zlib

import numpy as np

__all__ = ["ALPHA", "NULL_CLIENTS", "SHUFFLES", "SMALL_N", "SMALL_SHUFFLES", "TIE", "ChanceTest", "chance_test"]

#: Shuffles of the distances per test (the permutation test's resamples); :data:`SMALL_SHUFFLES` up to
#: :data:`SMALL_N` clients.
SHUFFLES = 19

#: Up to this many clients the test runs :data:`SMALL_SHUFFLES` shuffles: with few clients chance rebuilds the data's
#: very structure now and then (6 clients in 3 pairs: in about 3 % of shuffles), and 19 shuffles would decide such a
#: p-value by luck; each shuffle costs a few milliseconds there.
SMALL_N = 24
SMALL_SHUFFLES = 199

#: Two silhouettes closer than this are a tie (a shuffle that rebuilds the data's structure scores the same up to
#: rounding), and a tie counts against the data.
TIE = 1e-9

#: A cut is kept where its permutation p-value is at most this (19 shuffles: it beats all of them).
ALPHA = 0.05

#: Above this many clients each shuffle permutes the distances among a random subset of this many.
NULL_CLIENTS = 200


@dataclass(frozen=True)
class ChanceTest:
    """One test: the data's best mean silhouette, the shuffles' (``null``), and the verdict."""

    silhouette: float
    null: tuple[float, ...]
    alpha: float

    @property
    def p_value(self) -> float:
        """``(1 + shuffles at or above the data) / (shuffles + 1)``."""
        return (1 + sum(s >= self.silhouette - TIE for s in self.null)) / (len(self.null) + 1)

    @property
    def beats_chance(self) -> bool:
        return self.p_value <= self.alpha


def chance_test(d: np.ndarray, silhouette: float, best_silhouette: Callable[[np.ndarray], float],
                shuffles: Optional[int] = None, alpha: float = ALPHA, seed: Optional[int] = None) -> ChanceTest:
    """Test a cut whose mean silhouette on ``d`` ``[N, N]`` is ``silhouette`` against ``shuffles`` permutations of
    the distances (module docstring).

    Args:
        d: the client distances the cut was chosen on.
        silhouette: the cut's mean silhouette.
        best_silhouette: the procedure that chose the cut, as ``distances -> its best mean silhouette`` (0 where it
            finds no cut of 2 <= K <= N - 1).
        shuffles: permutations (default :data:`SHUFFLES`, :data:`SMALL_SHUFFLES` up to :data:`SMALL_N` clients);
            alpha: the largest p-value kept; seed: of the permutations (default: a checksum of ``d``, so that the
            same distances give the same verdict and different ones get shuffles of their own).

    Raises:
        ValueError: ``shuffles`` < 1 or ``alpha`` outside (0, 1].
    """
    n = d.shape[0]
    if shuffles is None:
        shuffles = SMALL_SHUFFLES if n <= SMALL_N else SHUFFLES
    if shuffles < 1:
        raise ValueError(f"shuffles={shuffles}: give at least 1")
    if not 0 < alpha <= 1:
        raise ValueError(f"alpha={alpha}: must lie in (0, 1]")
    rng = np.random.default_rng(zlib.crc32(np.ascontiguousarray(d, dtype=np.float64).tobytes()) if seed is None
                                else seed)
    null = []
    for _ in range(shuffles):
        sub = d
        if n > NULL_CLIENTS:
            pick = np.sort(rng.choice(n, NULL_CLIENTS, replace=False))
            sub = d[np.ix_(pick, pick)]
        m = sub.shape[0]
        upper = np.triu_indices(m, 1)
        shuffled = np.zeros((m, m))
        shuffled[upper] = rng.permutation(sub[upper])
        shuffled += shuffled.T
        null.append(float(best_silhouette(shuffled)))
    return ChanceTest(float(silhouette), tuple(null), alpha)
