"""Client clustering by pseudo-label distance: COSMOS Algorithm 1 (greedy threshold clustering).

The server sees only the uploaded pseudo-labels ``[N, n, M]``; it never reads ground-truth groups
(pitfall 3). The number of clusters K is an outcome of the threshold B0, not an input.

- :mod:`~cosmos_pl.clustering.distances`: the client distance matrix (L1, the paper's, or L2), chunked.
- :mod:`~cosmos_pl.clustering.native`: the compiled L1 kernel behind it.
- :mod:`~cosmos_pl.clustering.greedy`: Algorithm 1.
- :mod:`~cosmos_pl.clustering.threshold`: the rules that choose B0 (``auto``, ``otsu``, ``inf``, a number).
"""

from cosmos_pl.clustering.distances import pairwise_distances
from cosmos_pl.clustering.greedy import greedy_clustering, greedy_labels
from cosmos_pl.clustering.threshold import B0, otsu_threshold, resolve_b0, silhouette, silhouette_threshold

__all__ = ["pairwise_distances", "greedy_clustering", "greedy_labels", "otsu_threshold", "silhouette_threshold",
           "silhouette", "resolve_b0", "B0"]
