"""Client distances from uploaded pseudo-labels (COSMOS Section 4.1), without an ``[N, n, M]`` difference tensor.

The server holds the uploads ``[N, n, M]`` (what the clients sent); the distance matrix is built pair by pair over
column chunks, so the extra memory is ``O(N^2 + N * chunk)`` whatever N, n and M are. L1 (the paper's) runs in the
compiled kernel of :mod:`cosmos_pl.clustering.native` when a C compiler exists, else in torch.

Exact distances cost ``N^2/2 * n * M`` absolute differences: 2e12 at N = 2,000, |U| = 10,000, M = 100, more than a
round should wait for on a few cores (docs/performance.md). Above :data:`EXACT_BUDGET` the distances are estimated on a fixed random subsample of U: the distance is
a mean over the public samples, so a mean over n' of them is unbiased, with a standard error of about
``sd / sqrt(n')`` (sd: the spread of one sample's L1 difference, at most 2); :func:`public_samples_for` says how
many, and ``benchmarks/server_scale.py`` measures the error and its effect on the clustering.
"""

from __future__ import annotations

from typing import Literal, Optional

import numpy as np
import torch

from cosmos_pl.clustering import native
from cosmos_pl.errors import DataError, DivergenceError

__all__ = ["METRICS", "check_pseudo_labels", "pairwise_distances", "public_samples_for", "estimate_rows", "public_subsample", "spread", "CONSTANT_SPREAD", "EXACT_BUDGET", "MIN_ESTIMATE_SAMPLES"]

#: The client distances :func:`pairwise_distances` computes.
METRICS = ("l1", "l1_hard", "l2")

#: The most absolute differences exact distances may cost (N^2/2 * n * M); above, a subsample of U (about 7 s
#: here with the compiled kernel at this budget, ``benchmarks/server_scale.py``).
EXACT_BUDGET = 2e11
#: The fewest public samples an estimate uses, whatever it costs (a mean over fewer is too noisy to cluster on).
MIN_ESTIMATE_SAMPLES = 256

_CHUNK_ELEMENTS = 1 << 16  # L2 torch path: elements per chunk (256 KB per client row)
_L1_TORCH_CHUNK = 1 << 12  # L1 torch path: columns per cdist call; short float32 sums keep ~1e-6 relative


def check_pseudo_labels(pseudo_labels: torch.Tensor, metric: str = "l1") -> None:
    """Raise ValueError for a wrong rank or an unknown metric, DataError for an empty U, DivergenceError for
    non-finite pseudo-labels (naming the clients)."""
    if pseudo_labels.dim() != 3:
        raise ValueError(f"pseudo_labels must be [N, n, M], got shape {tuple(pseudo_labels.shape)}")
    if metric not in METRICS:
        raise ValueError(f"distance={metric!r}: use 'l1' (paper), 'l1_hard' or 'l2'")
    if pseudo_labels.shape[1] == 0:
        raise DataError("the public set U is empty (pseudo-labels [N, 0, M]): client distances are means over U and "
                        "undefined without it; set data.public_fraction > 0 (U needs at least 2 samples)")
    bad = [i for i in range(pseudo_labels.shape[0]) if not bool(torch.isfinite(pseudo_labels[i]).all())]
    if bad:
        raise DivergenceError(f"client(s) {bad} uploaded pseudo-labels holding NaN or inf: they cannot be clustered; "
                              "their training diverged (lower the learning rate or check the data)")


def _l1_torch(flat: torch.Tensor) -> np.ndarray:
    """Upper triangle of the L1 sums between rows of ``flat`` ``[N, D]``: ``torch.cdist(p=1)`` (torch's vectorized
    pairwise kernel) over column chunks, float32 within a chunk
    and float64 across chunks, as the C kernel."""
    n, d = flat.shape
    out = torch.zeros(n, n, dtype=torch.float64)
    for start in range(0, d, _L1_TORCH_CHUNK):
        chunk = flat[:, start:start + _L1_TORCH_CHUNK]
        out += torch.cdist(chunk, chunk, p=1.0).double()
    return torch.triu(out, diagonal=1).numpy()


def _l2_torch(p: torch.Tensor) -> np.ndarray:
    """Upper triangle of ``sum_x ||p_i(x) - p_j(x)||_2`` over public-sample chunks."""
    n, samples, m = p.shape
    out = torch.zeros(n, n, dtype=torch.float64)
    step = max(1, _CHUNK_ELEMENTS // max(m, 1))
    for start in range(0, samples, step):
        chunk = p[:, start:start + step].double()
        for i in range(n - 1):
            out[i, i + 1:] += (chunk[i + 1:] - chunk[i]).norm(dim=-1).sum(-1)
    return out.numpy()


def public_samples_for(num_clients: int, samples: int, classes: int, budget: float = EXACT_BUDGET) -> int:
    """How many of U's ``samples`` public samples :func:`pairwise_distances` reads for ``num_clients`` clients and
    ``classes`` classes: all of them while ``N^2/2 * n * M <= budget``, else as many as the budget affords (never
    fewer than :data:`MIN_ESTIMATE_SAMPLES`, nor more than n)."""
    pairs = num_clients * (num_clients - 1) / 2
    if pairs * samples * classes <= budget:
        return samples
    return int(min(samples, max(MIN_ESTIMATE_SAMPLES, budget // max(pairs * classes, 1))))


def estimate_rows(samples: int, used: int) -> Optional[np.ndarray]:
    """The public samples an estimate reads: ``used`` of ``samples`` drawn without replacement by a generator of
    fixed seed 0 (the same rows for the same sizes, in every run and on every machine), sorted; None for all."""
    if used >= samples:
        return None
    return np.sort(np.random.default_rng(0).choice(samples, size=used, replace=False))


def public_subsample(pseudo_labels: torch.Tensor, budget: float = EXACT_BUDGET) -> torch.Tensor:
    """The uploads ``[N, n, M]`` on the public samples the distances read under ``budget``: ``pseudo_labels`` itself
    while exact distances fit the budget, else ``[N, n', M]`` on :func:`estimate_rows` (a copy)."""
    rows = estimate_rows(pseudo_labels.shape[1], public_samples_for(*pseudo_labels.shape, budget))
    return pseudo_labels if rows is None else pseudo_labels[:, torch.from_numpy(rows)]


def _l1_hard(p: torch.Tensor) -> np.ndarray:
    """Upper triangle of ``2 * #{x : argmax f_i(x) != argmax f_j(x)}`` (the L1 sum between one-hot pseudo-labels),
    one client row at a time over int16 class indices ``[N, n]``: O(N^2 n) comparisons, no one-hot tensor."""
    top = p.argmax(dim=-1).numpy().astype(np.int16)  # ties: the lowest class index (torch's argmax)
    n = top.shape[0]
    out = np.zeros((n, n), dtype=np.float64)
    for i in range(n - 1):
        out[i, i + 1:] = 2.0 * (top[i + 1:] != top[i]).sum(axis=1)
    return out


def pairwise_distances(pseudo_labels: torch.Tensor, metric: Literal["l1", "l1_hard", "l2"] = "l1",
                       budget: float = EXACT_BUDGET) -> np.ndarray:
    """Client distance matrix from uploaded pseudo-labels.

    ``l1`` (the paper's, Section 4.1): ``d(i, j) = (1/n) sum_{x in U} ||f_i(x) - f_j(x)||_1``, the L1
    distance of the ``[n, M]`` pseudo-label matrices divided by n, so it lies in [0, 2] whatever |U| is.
    ``l1_hard`` (a named alternative): the same L1 distance between the one-hot pseudo-labels (temperature 0,
    ``argmax``), ``2 * (the fraction of U the two clients label differently)``: it ignores how confident a client is,
    which the soft distance mixes with what it predicts (clients whose outputs are flat agree in L1 whatever classes
    they predict; ``benchmarks/cluster_recovery.py`` measures both). ``l2`` (a named alternative):
    ``(1/n) sum_x ||f_i(x) - f_j(x)||_2``.

    Cost: ``N^2/2 * n * M`` absolute differences, in float32 summed in float64 per chunk (equal to a float64
    computation within about 1e-7 relative); no ``[N, n, M]`` temporary. L1 takes about 4 s at N = 500,
    |U| = 10,000, M = 100 on 2 cores with the compiled kernel (``benchmarks/server_scale.py``). Above ``budget``
    differences, the mean runs over :func:`public_samples_for` public samples (:func:`estimate_rows`) instead of
    all n: an estimate (see the module docstring).

    Args:
        pseudo_labels: ``[N, n, M]`` float, each row a distribution over M classes.
        metric: "l1" (default), "l1_hard" or "l2".
        budget: the most absolute differences computed exactly (default :data:`EXACT_BUDGET`; ``math.inf``: always
            exact).

    Returns:
        float64 ``[N, N]``, symmetric, zero diagonal, finite and non-negative.

    Raises:
        ValueError: wrong rank or unknown metric.
        DataError: n = 0 (an empty public set U: the distance is a mean over U, undefined on none).
        DivergenceError: a client's pseudo-labels hold NaN or inf (naming the clients).
    """
    check_pseudo_labels(pseudo_labels, metric)
    pseudo_labels = public_subsample(pseudo_labels, budget)
    n_clients, samples = pseudo_labels.shape[0], pseudo_labels.shape[1]
    if metric == "l1":
        flat = pseudo_labels.detach().to("cpu", torch.float32).reshape(n_clients, -1).contiguous()
        upper = native.l1_upper(flat.numpy())
        if upper is None:
            upper = _l1_torch(flat)
    elif metric == "l1_hard":
        upper = _l1_hard(pseudo_labels.detach().cpu())
    else:
        upper = _l2_torch(pseudo_labels.detach().cpu())
    upper = np.triu(upper, k=1) / samples
    return upper + upper.T


#: Below this spread a client's pseudo-labels are (nearly) the same for every public sample (see :func:`spread`).
CONSTANT_SPREAD = 0.02


def spread(pseudo_labels: torch.Tensor, budget: float = EXACT_BUDGET) -> np.ndarray:
    """Each client's spread of pseudo-labels over U: ``(1/n) sum_x ||f_i(x) - mean_x' f_i(x')||_1``, in [0, 2], on
    the public samples :func:`pairwise_distances` reads. 0: the client outputs one distribution for every sample (its
    label prior, typically: a model that learnt nothing else), so its distances to others say how alike the clients'
    priors are, not how alike their data; under :data:`CONSTANT_SPREAD` COSMOS names such clients.

    Args:
        pseudo_labels: ``[N, n, M]`` float.

    Returns:
        float64 ``[N]``.
    """
    p = public_subsample(pseudo_labels, budget)
    out = np.empty(p.shape[0])
    for i in range(p.shape[0]):  # one client at a time: no [N, n, M] temporary
        row = p[i].detach().to("cpu", torch.float64)
        out[i] = float((row - row.mean(dim=0)).abs().sum(dim=1).mean())
    return out
