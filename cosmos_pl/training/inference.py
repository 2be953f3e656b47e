"""Batched inference and evaluation of a model: soft pseudo-labels on U, accuracies on a client's splits.

Every prediction is checked finite; a batch that runs the GPU out of memory is retried at half the size. No
Lightning here (a node answering for its pseudo-labels does not import the trainer stack); torchmetrics is imported
where a score is computed.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from cosmos_pl.errors import DivergenceError
from cosmos_pl.losses import adjust_to_prior
from cosmos_pl.training.checks import (OUT_OF_MEMORY, PREDICTION_FIX, cuda_error_kind, nonfinite_kind,
                                       nonfinite_tensors, out_of_memory)
from cosmos_pl.training.config import TrainerConfig, apply_determinism, inference_batch, resolve_device
from cosmos_pl.training.resident import to_device
from cosmos_pl.transforms import prepare

__all__ = ["batched_logits", "evaluate", "evaluate_models", "predict_probs", "teacher_prior"]


def _autocast(device: torch.device, precision: str):
    if precision.startswith("bf16"):
        return torch.autocast(device.type, dtype=torch.bfloat16)
    if precision.startswith("16") and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.float16)
    return contextlib.nullcontext()


def _nonfinite_logits_error(model: nn.Module, logits: torch.Tensor, start: int, n: int, where: str,
                            precision: str) -> DivergenceError:
    rows = ~torch.isfinite(logits).all(dim=1)
    bad = nonfinite_tensors(model)
    state = (f"its weights are non-finite ({bad[0]}{f' and {len(bad) - 1} others' if len(bad) > 1 else ''})" if bad
             else "its weights are finite but so large that the activations overflow")
    fix = PREDICTION_FIX
    if precision.startswith("16"):
        fix += ", or use trainer.precision bf16-mixed or 32-true (float16 overflows above 65504)"
    return DivergenceError(f"{where}: the model's outputs are non-finite ({nonfinite_kind(logits)}) for "
                           f"{int(rows.sum())} of the inputs {start}..{start + len(logits) - 1} (of {n}); {state}: "
                           f"training diverged; {fix}")


def batched_logits(model: nn.Module, x: torch.Tensor, trainer: TrainerConfig, where: str = "inference", *,
                   keep_on_device: bool = False):
    """Yield ``(start, float logits [b, M])`` per inference batch of ``x``, in order; raise :class:`DivergenceError`
    at the first batch with a non-finite logit.

    ``x`` goes to the GPU batch by batch; with ``keep_on_device`` (``x`` is U, which many tasks read) it goes whole,
    once per process: a resident ``x``'s copy (:func:`~cosmos_pl.training.resident.to_device`) is the one the
    training stages read too. A batch that runs the GPU out of memory is retried at half the batch size (and the
    rest of ``x`` goes at that size); at batch size 1 it raises :class:`DeviceMemoryError` naming
    ``trainer.inference_batch_size``."""
    device = resolve_device(trainer.accelerator)
    kept = to_device(x, device) if keep_on_device and device.type == "cuda" else None
    apply_determinism(trainer)
    was_training = model.training
    model.eval().to(device)
    if trainer.channels_last:
        model.to(memory_format=torch.channels_last)
    size, start = inference_batch(trainer, device), 0
    try:
        with torch.inference_mode(), _autocast(device, trainer.precision):
            while start < len(x):
                try:
                    batch = kept[start : start + size] if kept is not None else \
                        x[start : start + size].to(device, non_blocking=True)
                    logits = model(prepare(batch, channels_last=trainer.channels_last)).float()
                except Exception as err:  # torch's allocator, or a cuBLAS/cuDNN workspace that did not fit
                    if cuda_error_kind(err) != OUT_OF_MEMORY:
                        raise
                    logits = None
                if logits is None:  # outside the except block: its traceback no longer holds the activations
                    torch.cuda.empty_cache()
                    if size == 1:
                        raise out_of_memory(where, size, "trainer.inference_batch_size", trainer)
                    size //= 2
                    continue
                if not bool(torch.isfinite(logits).all()):
                    raise _nonfinite_logits_error(model, logits, start, len(x), where, trainer.precision)
                yield start, logits
                start += len(logits)
    finally:
        model.cpu().train(was_training)


def predict_probs(model: nn.Module, x: torch.Tensor, trainer: TrainerConfig, where: str = "inference", *,
                  keep_on_device: bool = False) -> torch.Tensor:
    """Soft pseudo-labels ``softmax(model(x))``: uint8 ``[n, C, H, W]`` -> float32 ``[n, M]`` on the CPU.
    ``keep_on_device``: ``x`` is U, copied to the GPU once per process (see :func:`batched_logits`).

    Raises:
        DivergenceError: a logit is non-finite; the message starts with ``where`` (e.g. ``"round 1,
            pseudo-labels on U, client 3"``).
    """
    chunks = [logits.softmax(dim=1).cpu()
              for _, logits in batched_logits(model, x, trainer, where, keep_on_device=keep_on_device)]
    return torch.cat(chunks) if chunks else torch.empty(0)


def teacher_prior(model: nn.Module, public: torch.Tensor, trainer: TrainerConfig,
                  where: str = "teacher on U") -> torch.Tensor:
    """The prior a teacher carries: its mean output on U (``public``, uint8 ``[n, C, H, W]``), float32 ``[M]``.
    Computed once per teacher and round, then given to every client's evaluation (:func:`evaluate_models`).

    Raises:
        DivergenceError: a logit is non-finite; the message starts with ``where``.
    """
    return predict_probs(model, public, trainer, where, keep_on_device=True).mean(dim=0)


def _metrics(num_classes: int) -> dict:
    from torchmetrics.classification import MulticlassAccuracy

    metrics = {"top1": MulticlassAccuracy(num_classes, top_k=1, average="micro")}
    if num_classes >= 20:
        metrics["top5"] = MulticlassAccuracy(num_classes, top_k=5, average="micro")
    return metrics


def evaluate(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, num_classes: int, trainer: TrainerConfig,
    where: str = "evaluation",
) -> dict[str, float]:
    """Top-1 (and top-5 where M >= 20) accuracy of ``model`` on ``(x, y)`` as fractions, with torchmetrics;
    NaN (undefined, never 0) on an empty set.

    Raises:
        DivergenceError: a logit is non-finite (an accuracy over NaN outputs would be a silent chance level).
    """
    metrics = _metrics(num_classes)
    if len(y) == 0:
        return {k: float("nan") for k in metrics}
    for start, logits in batched_logits(model, x, trainer, where):
        target = y[start : start + len(logits)]
        for m in metrics.values():
            m.update(logits.cpu(), target)
    return {k: float(m.compute()) for k, m in metrics.items()}


def _accuracy(probs: torch.Tensor, y: torch.Tensor, num_classes: int) -> dict[str, float]:
    metrics = _metrics(num_classes)
    if len(y) == 0:
        return {k: float("nan") for k in metrics}
    return {k: float(m(probs, y)) for k, m in metrics.items()}


def evaluate_models(models: dict[str, nn.Module], x: torch.Tensor, y: torch.Tensor, num_classes: int,
                    trainer: TrainerConfig, where: str = "evaluation", class_counts: torch.Tensor | None = None,
                    public: torch.Tensor | None = None,
                    carried: torch.Tensor | None = None) -> dict[str, dict[str, float]]:
    """Test accuracies of several models for one client (its own f_i, its cluster teacher h_pi(i), ...), by name.

    With ``class_counts`` (``[M]``, the client's training labels) and the prior the teacher carries, a
    ``"teacher"`` is also scored as the client would use it, ``"teacher_prior"``: its probabilities on ``x`` shifted
    to the client's label prior (:func:`cosmos_pl.losses.adjust_to_prior`). That prior is ``carried`` (``[M]``,
    :func:`teacher_prior`, computed once for all the teacher's clients), else computed here from ``public`` (U,
    uint8 ``[n, C, H, W]``). Reported beside the teacher's own accuracy, never instead of it.

    Raises:
        DivergenceError: a model's logit is non-finite; the message names ``where`` and the model's name.
    """
    shifted = models.get("teacher") is not None and class_counts is not None and \
        (carried is not None or (public is not None and len(public) > 0))
    out = {name: evaluate(model, x, y, num_classes, trainer, f"{where}, {name} model")
           for name, model in models.items() if not (shifted and name == "teacher")}
    if shifted:  # the teacher's logits on x once, for both of its scores
        teacher = models["teacher"]
        logits = torch.cat([b for _, b in batched_logits(teacher, x, trainer, f"{where}, teacher model")]) \
            if len(y) else torch.empty(0, num_classes)
        out["teacher"] = _accuracy(logits.cpu(), y, num_classes)
        if carried is None:
            carried = teacher_prior(teacher, public, trainer, f"{where}, teacher on U")
        adjusted = adjust_to_prior(logits.cpu().softmax(dim=1), class_counts, carried) if len(y) else logits
        out["teacher_prior"] = _accuracy(adjusted, y, num_classes)
    return {name: out[name] for name in [*models, "teacher_prior"] if name in out}
