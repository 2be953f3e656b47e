"""Client clustering by pseudo-label distance: COSMOS Algorithm 1 (greedy threshold clustering).

The server sees only the uploaded pseudo-labels ``[N, n, M]``; it never reads ground-truth groups
(pitfall 3). The number of clusters K is an outcome of the threshold B0, not an input.

- :mod:`~cosmos_pl.clustering.distances`: the client distance matrix (L1, the paper's, or L2), chunked.
- :mod:`~cosmos_pl.clustering.native`: the compiled L1 kernel behind it.
- :mod:`~cosmos_pl.clustering.greedy`: Algorithm 1.
- :mod:`~cosmos_pl.clustering.threshold`: the rules that choose B0 (``auto``, ``silhouette``, ``otsu``, ``inf``,
  a number) and how clear a clustering's structure is.
"""

from cosmos_pl.clustering.distances import pairwise_distances
from cosmos_pl.clustering.greedy import greedy_clustering, greedy_labels
from cosmos_pl.clustering.threshold import (B0, RULES, Structure, otsu_threshold, resolve_b0, separated_threshold,
                                           silhouette, silhouette_threshold, structure)

__all__ = ["pairwise_distances", "greedy_clustering", "greedy_labels", "otsu_threshold", "silhouette_threshold",
           "separated_threshold", "silhouette", "structure", "Structure", "resolve_b0", "RULES", "B0"]
