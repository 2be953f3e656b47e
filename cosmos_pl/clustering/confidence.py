"""A confidence floor for the client distances: flat pseudo-labels re-tempered before they are compared.

The soft L1 distance of Section 4.1 mixes two things: which classes a client predicts on each public sample, and how
confident it is. Confidence follows a client's training (its data size, epochs, architecture), not its data
distribution, and flat outputs are close in L1 whatever classes they favour: on Fashion-MNIST at 40 clients (72
training images each) clients of all five groups that upload flat pseudo-labels formed one tight cluster, which
every distance-based rule kept, and its teacher scored far below these clients' own models
(``benchmarks/cluster_recovery.py``). So, for the distances only, each client whose mean top probability over U is
under the floor is re-tempered, ``p -> p^beta / sum_c p_c^beta`` with the one ``beta > 1`` that lifts its mean top
probability to the floor (temperature scaling, Guo et al., 2017, used here for comparability rather than
calibration). Its argmax on every sample is unchanged, as is the ranking of its classes; a client at or above the
floor is not touched, so for clients that learnt their task the distances are the paper's. The teachers still learn
from the uploads as sent. ``confidence_floor: 0`` turns it off (the paper's plain distance).
"""

from __future__ import annotations

import numpy as np
import torch

from cosmos_pl.clustering.distances import estimate_rows

__all__ = ["DEFAULT_CONFIDENCE_FLOOR", "FIT_SAMPLES", "check_confidence_floor", "mean_confidence",
           "temper_to_floor"]

#: The default floor, chosen among 0.4, 0.5, 0.6, 0.7 and 0.8 on ``benchmarks/cluster_recovery.py``'s federations.
#: Fashion-MNIST at 40 clients (5 seeds): mean ARI 0.43 with no floor, 0.87 at 0.4, 0.97 at 0.5 and 0.6, 0.95 at 0.7,
#: 0.92 at 0.8. Planted, 500 clients, the groups overlapping most (overlap 1.0): 0.61 with no floor, 0.76 at 0.4,
#: 0.48 at 0.5, 0.36 at 0.6 (the planted clients' flatness is noise on their log-probabilities, which re-tempering
#: sharpens). 0.5 is the lowest that recovers the real federations.
DEFAULT_CONFIDENCE_FLOOR = 0.5

_MAX_BETA = 1e4  # an output flat on every sample (all classes tied) never reaches the floor: it stops here
_TOL = 1e-6  # on log(beta): the search stops when a step moves it less than this (beta to about 1e-6 relative)
_MAX_STEPS = 100  # safeguarded Newton: about 5-10 steps; the bisection fallback halves the bracket at worst
_CHUNK_ELEMENTS = 1 << 22  # clients per chunk of the fit: about 16 MB of float32 per [c, n, M] temporary
#: beta is fitted on at most this many public samples (the fixed random draw of
#: :func:`~cosmos_pl.clustering.distances.estimate_rows`, so no periodic order of U lines up with it), then applied to
#: all: a client lands within a few hundredths of the floor (planted, 200 clients, 1,000 samples, M = 100: at most
#: 0.05 off), which does not matter for a floor, and the fit stays seconds at N = 2,000 clients with M = 100 classes
#: (``benchmarks/server_scale.py``)
FIT_SAMPLES = 256


def check_confidence_floor(floor: float) -> None:
    """Raise ValueError naming ``floor`` unless it is a mean top probability in [0, 1) (0: no floor)."""
    if not 0.0 <= floor < 1.0:
        raise ValueError(f"confidence_floor={floor!r}: give a mean top probability in [0, 1) (0: no floor)")


def mean_confidence(pseudo_labels: torch.Tensor) -> np.ndarray:
    """Each client's mean top probability over the public samples, ``(1/n) sum_x max_c f_i(x)_c``.

    Args:
        pseudo_labels: ``[N, n, M]`` float, each row a distribution over M classes.

    Returns:
        float64 ``[N]`` in [1/M, 1].
    """
    return pseudo_labels.detach().cpu().amax(dim=-1).double().mean(dim=-1).numpy()  # no float64 copy of [N, n, M]


def _exponents(delta: torch.Tensor, floor: float) -> torch.Tensor:
    """The exponent beta (>= 1) per client that lifts its mean top probability to ``floor``, for a chunk of clients'
    log-probabilities minus each sample's largest, ``delta`` ``[c, n, M]`` float32 (<= 0); the bracket and the
    exponent itself are kept in float64.

    The mean top probability at exponent beta is ``f(beta) = (1/n) sum_x 1 / sum_c exp(beta * delta_xc)``, which rises
    with beta; it is solved on t = log(beta) by Newton's method kept inside a bracket (a step that leaves it bisects
    instead), all clients of the chunk at once. A client that does not reach the floor at ``_MAX_BETA`` gets it."""
    count = delta.shape[0]
    lo = torch.zeros(count, dtype=torch.float64)
    hi = torch.full((count,), float(np.log(_MAX_BETA)), dtype=torch.float64)
    t = lo.clone()
    for _ in range(_MAX_STEPS):
        beta = t.exp()
        e = torch.exp(beta.float()[:, None, None] * delta)
        total = e.sum(dim=-1)  # [c, n]
        g = (1.0 / total).double().mean(dim=-1) - floor
        slope = beta * (-(delta * e).sum(dim=-1) / total ** 2).double().mean(dim=-1)  # dg/dt >= 0
        lo = torch.where(g < 0, t, lo)
        hi = torch.where(g >= 0, t, hi)
        step = t - g / slope
        step = torch.where(torch.isfinite(step) & (step > lo) & (step < hi), step, (lo + hi) / 2)
        done = (step - t).abs().max().item() < _TOL
        t = step
        if done:
            break
    return t.exp()


def temper_to_floor(pseudo_labels: torch.Tensor, floor: float,
                    in_place: bool = False) -> tuple[torch.Tensor, dict[int, float]]:
    """The uploads with every client under the confidence ``floor`` re-tempered to it (see the module docstring).

    Args:
        pseudo_labels: ``[N, n, M]`` float, each row a distribution over M classes.
        floor: the mean top probability a client is lifted to, in [0, 1); 0 changes nothing.
        in_place: re-temper the rows of ``pseudo_labels`` itself (a float32 CPU tensor the caller owns, such as a
            subsample of U) instead of a copy.

    Returns:
        ``(tempered [N, n, M] float32, {client row: beta})``: the rows of clients at or above the floor are the
        input's; the dict names the re-tempered rows with their exponent beta (> 1), fitted on at most
        :data:`FIT_SAMPLES` public samples (exactly to the floor where n is no more than that; a client whose fitted
        samples already reach the floor is left as it is). An output with every class tied on every sample cannot
        be lifted: it gets the largest exponent tried and stays as it is.

    Raises:
        ValueError: ``floor`` outside [0, 1).
    """
    check_confidence_floor(floor)
    conf = mean_confidence(pseudo_labels)
    low = np.flatnonzero(conf < floor)
    if low.size == 0:
        return pseudo_labels, {}
    own = in_place and pseudo_labels.dtype == torch.float32 and pseudo_labels.device.type == "cpu"
    out = pseudo_labels.detach() if own else pseudo_labels.detach().to("cpu", torch.float32).clone()
    betas: dict[int, float] = {}
    samples = out.shape[1]
    drawn = estimate_rows(samples, FIT_SAMPLES)  # the distances' fixed draw of U, sized for the fit
    fit = torch.arange(samples) if drawn is None else torch.from_numpy(drawn)
    step = max(1, _CHUNK_ELEMENTS // max(1, len(fit) * out.shape[2]))
    for start in range(0, len(low), step):
        rows = torch.from_numpy(low[start:start + step])
        # the fit on the fitted samples; log-probabilities floored so that an exact 0 stays the smallest without
        # -inf * 0 = nan
        logp = out[rows[:, None], fit[None, :]].clamp_min(1e-30).log()  # [c, fitted, M]
        beta = _exponents(logp - logp.amax(dim=-1, keepdim=True), floor)
        # a client already at the floor on the fitted samples (beta 1) is left as it is
        betas.update({int(i): float(b) for i, b in zip(rows, beta) if b > 1.0})
    for i, beta in betas.items():  # then every sample, one client at a time in float32 (softmax shifts by the max)
        out[i] = torch.softmax(out[i].clamp_min(1e-30).log_() * beta, dim=-1)
    return out, betas
