"""The distillation losses of COSMOS: KL to soft pseudo-labels plus the consistency regularizer r_B.

Shapes: logits ``[B, M]``, pseudo-labels (probabilities) ``[B, M]``, per-sample weights ``[B]``.
Reduction is "batchmean" as in the paper (Appendix C, nn.KLDivLoss(reduction='batchmean')):
the weighted sum over the batch divided by B.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["apply_temperature", "adjust_to_prior", "kl_per_sample", "distillation_loss"]


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


def distillation_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    view_logits: torch.Tensor | None = None,
    lam: float = 0.0,
    weights: torch.Tensor | None = None,
    target_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Eq. 1 (server) / Eq. 2 (client) of the COSMOS paper, for one batch.

    ``loss = (1/B) sum_x w(x) [ KL(target(x) || g(x)) + lam * r_B(g)(x) ]`` with
    ``r_B(g)(x) = sum_{x' in S} KL(g(x) || g(x'))`` (the paper's l(g(x'), g(x)) with l = KL to the target g(x)).
    r_B always sends gradient through the views g(x') (pitfall 1: a regularizer computed under no_grad adds
    nothing). By default the clean prediction g(x) is its target, held fixed (stop-gradient) as the
    second argument of l is in the KL term; ``target_grad=True`` lets gradient flow into g(x) too. On
    Fashion-MNIST a from-scratch teacher with lambda 5 reached the 4-client ensemble's accuracy with the
    fixed target and fell 4 points below it with gradient on both sides (the target drifts toward the views).

    Args:
        logits: ``[B, M]`` model logits on the clean inputs x.
        targets: ``[B, M]`` soft pseudo-labels (rows on the simplex).
        view_logits: ``[S, B, M]`` or ``[B, M]`` logits on views x' in B(x); None skips r_B.
        lam: lambda >= 0, the weight of r_B.
        weights: ``[B]`` per-sample weights w_i(x) (default all ones).
        target_grad: also back-propagate r_B through the clean prediction g(x) (default False).

    Returns:
        (total, kl, r_B): scalars, the last two already weighted and batch-averaged (total = kl + lam * r_B).
    """
    b = logits.shape[0]
    w = torch.ones(b, device=logits.device, dtype=torch.float32) if weights is None else weights.float()
    log_q = torch.log_softmax(logits.float(), dim=1)
    kl = (w * kl_per_sample(log_q, targets.float())).sum() / b
    if view_logits is None or lam == 0:
        reg = torch.zeros((), device=logits.device)
    else:
        views = view_logits.float()
        if views.dim() == 2:
            views = views[None]
        p_clean = log_q.exp() if target_grad else log_q.exp().detach()
        per_view = torch.stack([kl_per_sample(torch.log_softmax(v, dim=1), p_clean) for v in views])  # [S, B]
        reg = (w * per_view.sum(dim=0)).sum() / b
    return kl + lam * reg, kl, reg
