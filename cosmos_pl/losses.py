"""Operations on pseudo-labels shared by the objectives, the server and evaluation: re-tempering, the shift to a
client's label prior, and the per-sample KL divergence the distillation losses are built of
(:func:`cosmos_pl.objectives.distill.distillation_loss`, :func:`cosmos_pl.objectives.joint.joint_loss`).

Shapes: pseudo-labels (probabilities) ``[n, M]``, log-probabilities ``[B, M]``, class counts ``[M]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["apply_temperature", "adjust_to_prior", "kl_per_sample"]


def apply_temperature(probs: torch.Tensor, temperature: float) -> torch.Tensor:
    """Re-temper pseudo-labels: ``p^(1/T) / sum(p^(1/T))`` per row; T=1 is the identity, T=0 one-hot argmax.

    Each row's log-probabilities are shifted so its largest is 0 before dividing by T: however small T, the
    largest entry stays finite and the result never holds NaN (it tends to the one-hot argmax, ties shared).

    Args:
        probs: ``[n, M]`` rows on the simplex.
        temperature: T >= 0 (COSMOS paper, Appendix D: T=0 means hard labels, T=1 the default).

    Raises:
        ValueError: T < 0 or not a number.
    """
    if not temperature >= 0:
        raise ValueError(f"temperature={temperature}: must be >= 0 (0 = hard labels, 1 = unchanged)")
    if temperature == 0:
        return F.one_hot(probs.argmax(dim=1), probs.shape[1]).to(probs.dtype)
    if temperature == 1:
        return probs
    log_p = torch.log(probs.clamp_min(1e-12))
    return torch.softmax((log_p - log_p.amax(dim=1, keepdim=True)) / temperature, dim=1)


def adjust_to_prior(probs: torch.Tensor, class_counts: torch.Tensor,
                    source_prior: torch.Tensor | None = None) -> torch.Tensor:
    """Shift pseudo-labels to a client's own label prior (label-shift correction, Saerens et al., 2002).

    ``p'(y|x) ∝ p(y|x) * pi_i(y) / pi_U(y)``, where ``pi_U`` is the prior the probabilities carry (``source_prior``;
    default the mean of ``probs`` over its rows, U) and ``pi_i`` the client's class frequencies with one added to
    every count (so that no class is zeroed). The client computes this from its own labels; nothing is sent. Used as
    COSMOS's ``client_prior_correction`` on the cluster teacher's targets before Eq. 2, and to score the teacher
    as the client would use it (its mean output on U as ``source_prior``, applied to its outputs on the client's
    test images).

    Args:
        probs: ``[n, M]`` probabilities, rows on the simplex.
        class_counts: ``[M]`` the client's label counts.
        source_prior: ``[M]`` the prior ``probs`` carry, or None (their mean).

    Returns:
        ``[n, M]`` rows on the simplex.

    Raises:
        ValueError: ``class_counts`` does not have M entries.
    """
    if class_counts.shape != (probs.shape[1],):
        raise ValueError(f"class_counts has shape {tuple(class_counts.shape)}; expected ({probs.shape[1]},)")
    prior = class_counts.to(probs.dtype) + 1
    prior = prior / prior.sum()
    carried = probs.mean(dim=0) if source_prior is None else source_prior.to(probs.dtype)
    adjusted = probs * (prior / carried.clamp_min(1e-12))
    return adjusted / adjusted.sum(dim=1, keepdim=True)


def kl_per_sample(log_q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """``KL(p || q) = sum_m p_m (log p_m - log q_m)`` per row, ``[B, M] -> [B]``; 0 log 0 = 0."""
    return F.kl_div(log_q, p, reduction="none").sum(dim=1)
