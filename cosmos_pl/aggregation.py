"""Aggregation of the pseudo-labels of one cluster's clients (COSMOS paper, Section 4.1 Step 3; Appendix D)."""

from __future__ import annotations

from typing import Literal

import torch

__all__ = ["aggregate", "AGGREGATIONS"]

AGGREGATIONS = ("mean", "median", "max")


def aggregate(pseudo_labels: torch.Tensor, rule: Literal["mean", "median", "max"] = "mean") -> torch.Tensor:
    """Combine a cluster's pseudo-labels ``[G, n, M] -> [n, M]``, renormalized to the simplex.

    ``mean`` is the paper's f_bar_k(x) = (1/|G_k|) sum_i f_i(x) (already on the simplex); ``median`` (the
    element-wise lower median, torch's convention for even G) and ``max`` are element-wise over the clients,
    each row then divided by its sum. A row whose median is all zeros falls back to the mean for that row.

    Raises:
        ValueError: an unknown rule (naming the valid ones) or an empty cluster.
    """
    if rule not in AGGREGATIONS:
        raise ValueError(f"aggregation={rule!r}: use one of {AGGREGATIONS}")
    if pseudo_labels.dim() != 3 or pseudo_labels.shape[0] == 0:
        raise ValueError(f"pseudo_labels must be [G>=1, n, M], got shape {tuple(pseudo_labels.shape)}")
    p = pseudo_labels.float()
    if rule == "mean":
        out = p.mean(dim=0)
    elif rule == "median":
        out = p.median(dim=0).values
    else:
        out = p.max(dim=0).values
    sums = out.sum(dim=1, keepdim=True)
    # divide by the true sum however small (a clamp such as 1e-12 left rows summing to far less than 1)
    return torch.where(sums > 0, out / torch.where(sums > 0, sums, torch.ones_like(sums)), p.mean(dim=0))
