"""Client clustering by pseudo-label distance (COSMOS Section 4.1): Algorithm 1 (greedy threshold clustering), the
rules that choose its threshold B0, and the default ``auto`` rule that clusters cluster by cluster.

The server sees only the uploaded pseudo-labels ``[N, n, M]``; it never reads ground-truth groups. The number of
clusters K is an outcome, not an input.

- :mod:`~cosmos_pl.clustering.distances`: the client distance matrix (L1, the paper's, or L2), chunked, with an
  estimate from a subsample of U above a work budget.
- :mod:`~cosmos_pl.clustering.native`: the compiled L1 kernel behind it.
- :mod:`~cosmos_pl.clustering.confidence`: the confidence floor (flat pseudo-labels re-tempered before comparing).
- :mod:`~cosmos_pl.clustering.inputs`: what the clustering step reads from the uploads (distances, flags).
- :mod:`~cosmos_pl.clustering.greedy`: Algorithm 1.
- :mod:`~cosmos_pl.clustering.threshold`: the rules that choose B0 (``strict``, ``silhouette``, ``otsu``, ``inf``,
  a number) and how clear a clustering's structure is.
- :mod:`~cosmos_pl.clustering.per_cluster`: ``auto``: the best cut of an average-linkage hierarchy, kept where it
  beats chance (:mod:`~cosmos_pl.clustering.chance`: the same distances shuffled), then the uninformative clients
  placed with the nearest informative one; ``silhouette_floor``: each cluster kept on its own silhouette instead.
- :mod:`~cosmos_pl.clustering.choose`: from a ``b0`` setting to the clusters (the entry point COSMOS calls).
"""

from cosmos_pl.clustering.choose import B0_SETTINGS, ClientClustering, check_b0, cluster_clients
from cosmos_pl.clustering.confidence import DEFAULT_CONFIDENCE_FLOOR, mean_confidence, temper_to_floor
from cosmos_pl.clustering.distances import (CONSTANT_SPREAD, pairwise_distances, public_samples_for, public_subsample,
                                           spread)
from cosmos_pl.clustering.greedy import greedy_clustering, greedy_labels
from cosmos_pl.clustering.inputs import ClusterInputs, cluster_inputs
from cosmos_pl.clustering.per_cluster import FLOOR, PerCluster, per_cluster_clustering
from cosmos_pl.clustering.threshold import (B0, RULES, Structure, otsu_threshold, resolve_b0, separated_threshold,
                                           silhouette, silhouette_threshold, silhouettes, structure)

__all__ = ["pairwise_distances", "greedy_clustering", "greedy_labels", "otsu_threshold", "silhouette_threshold",
           "separated_threshold", "silhouette", "silhouettes", "structure", "Structure", "resolve_b0", "RULES", "B0",
           "B0_SETTINGS", "ClientClustering", "check_b0", "cluster_clients", "FLOOR", "PerCluster",
           "per_cluster_clustering", "public_samples_for", "public_subsample", "spread", "CONSTANT_SPREAD",
           "DEFAULT_CONFIDENCE_FLOOR", "mean_confidence", "temper_to_floor", "ClusterInputs", "cluster_inputs"]
