"""One training stage = one Lightning Trainer over one model; plus batched inference and evaluation.

Each stage is seeded from (experiment seed, round, stage, model id), so its numbers do not depend on
what ran before it or where it runs (pitfall 9).

Nothing non-finite passes silently: a training step's loss, a model's weights after a stage, the targets a stage
trains on and every prediction are checked, and a :class:`~cosmos_pl.errors.DivergenceError` names the stage
(``where``: round, stage, client or teacher), the step and the setting to change.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
import weakref
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.utilities.seed import seed_everything
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, Sampler, SequentialSampler
from torchmetrics.classification import MulticlassAccuracy

from cosmos_pl import signals
from cosmos_pl.errors import DeviceMemoryError, DivergenceError
from cosmos_pl.training.config import TrainerConfig, apply_determinism, resolve_device, stage_seed  # re-exported
from cosmos_pl.modules import DistillationModule, JointModule, ProximalModule, SupervisedModule
from cosmos_pl.modules.base import CosmosModule, OptimizerFactory
from cosmos_pl.transforms import Transformations, prepare

__all__ = [
    "TrainerConfig",
    "stage_seed",
    "fit_supervised",
    "fit_distillation",
    "fit_joint",
    "fit_proximal",
    "fine_tune",
    "start_global",
    "predict_probs",
    "evaluate",
    "evaluate_models",
    "nonfinite_tensors",
    "resolve_device",
]

_LIGHTNING_LOGGERS = ("lightning.pytorch", "lightning.fabric", "lightning.pytorch.utilities.rank_zero")
_QUIET_WARNINGS = (".*does not have many workers.*", ".*LeafSpec.*", ".*smaller than the logging interval.*",
                   ".*Precision.*is not supported by the model summary.*")

@contextlib.contextmanager
def _quiet_lightning():
    """Per-stage Trainers are many and short: hold back their start-up chatter during one stage only,
    leaving the process's logging and warning settings as they were."""
    loggers = [logging.getLogger(name) for name in _LIGHTNING_LOGGERS]
    levels = [lg.level for lg in loggers]
    with warnings.catch_warnings():
        for pattern in _QUIET_WARNINGS:
            warnings.filterwarnings("ignore", message=pattern)
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for lg, level in zip(loggers, levels):
                lg.setLevel(level)


class _Batches(Dataset):
    """Map-style dataset indexed by a whole list of indices: one tensor gather per batch, no per-sample collate."""

    def __init__(self, *tensors: torch.Tensor) -> None:
        self.tensors = tensors

    def __len__(self) -> int:
        return len(self.tensors[0])

    def __getitem__(self, idx: list[int]) -> tuple[torch.Tensor, ...]:
        index = torch.as_tensor(idx)
        return tuple(t[index] for t in self.tensors)


def _loader(tensors: tuple[torch.Tensor, ...], batch_size: int, shuffle: bool) -> DataLoader:
    n = len(tensors[0])
    base = RandomSampler(range(n)) if shuffle else SequentialSampler(range(n))
    # drop a last batch of 1: BatchNorm cannot train on a single sample
    drop_last = shuffle and n > batch_size and n % batch_size == 1
    sampler = BatchSampler(base, batch_size=batch_size, drop_last=drop_last)
    return DataLoader(_Batches(*tensors), sampler=sampler, batch_size=None, num_workers=0)


# GPU copies of resident tensors (a client's data, U: registered with Executor.keep_resident, which tags them), one
# per tensor and device in this process, kept for the process's life: later stages and rounds reuse them instead of
# copying the data to the GPU again. The weak reference checks that the copy is of this very tensor.
_DEVICE_COPIES: dict[tuple[str, str], tuple[weakref.ref, torch.Tensor]] = {}


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    # cosmos_pl.federated.transfer.RESIDENT_ATTR: spelt out here, training/ imports nothing of the round loop
    name = getattr(t, "_cosmos_resident", None)
    if name is None:
        return t.to(device)
    kept = _DEVICE_COPIES.get((name, str(device)))
    if kept is not None and kept[0]() is t:
        return kept[1]
    copy = t.to(device)
    _DEVICE_COPIES[(name, str(device))] = (weakref.ref(t), copy)
    return copy


def _on_device(trainer: TrainerConfig, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Hold a stage's (small, uint8) data on the GPU when there is one: batches are then gathered and
    augmented there, with no host-to-device copy per step; a resident tensor's copy is made once per process."""
    device = resolve_device(trainer.accelerator)
    return tuple(_to_device(t, device) for t in tensors) if device.type == "cuda" else tensors


def _fit(module: CosmosModule, model: nn.Module, trainer: TrainerConfig, epochs: int, loader: Any) -> None:
    """Train ``module`` (whose backbone is ``model``) for ``epochs``; then check ``model``'s weights are finite.

    Raises:
        DivergenceError: a step's loss (see :class:`CosmosModule`) or, after training, a weight or floating
            buffer (e.g. BatchNorm statistics) is non-finite.
    """
    if trainer.compile:
        module.backbone = torch.compile(module.backbone)  # shares the parameters of the model trained in place
    out_of_memory_error = None
    try:
        with _quiet_lightning():
            _trainer(trainer, epochs).fit(module, train_dataloaders=loader)
    except torch.cuda.OutOfMemoryError:
        batch_key = ("clients.batch_size" if module.optimizer_key.startswith("clients.")
                     else "algorithm.init_args.teacher_batch_size")
        out_of_memory_error = out_of_memory(module.where, getattr(loader.sampler, "batch_size", None), batch_key,
                                            trainer)
    if out_of_memory_error is not None:  # outside the except block: its traceback no longer holds the activations
        torch.cuda.empty_cache()  # for the other workers on this GPU
        raise out_of_memory_error
    signals.check()  # a stop request whose exception was lost inside the stage (cosmos_pl.signals)
    bad = nonfinite_tensors(model)
    if bad:
        others = f" and {len(bad) - 1} other tensors" if len(bad) > 1 else ""
        raise module.diverged(f"after {epochs} epoch(s) the model's weights are non-finite ({bad[0]}{others}) "
                              f"although every training loss was finite")


def out_of_memory(where: str, batch_size: int | None, batch_key: str, trainer: TrainerConfig) -> DeviceMemoryError:
    """The one-line error for a GPU out of memory in the stage ``where`` (round, stage, client or teacher) at
    ``batch_size``, naming ``batch_key`` (the setting of that batch size) and the other settings that lower memory."""
    lower = [f"lower {batch_key}"]
    if trainer.precision in ("32-true", "32"):
        lower.append("train in trainer.precision=bf16-mixed")
    lower.append("run fewer workers per GPU (executor.workers_per_device)")
    return DeviceMemoryError(f"{where}: the GPU ran out of memory at batch size {batch_size} "
                             f"(trainer.precision={trainer.precision}); {', or '.join(lower)}")


def nonfinite_tensors(model: nn.Module) -> list[str]:
    """Names of ``model``'s floating-point parameters and buffers holding a NaN or an infinity (one host sync)."""
    named = [(k, t) for k, t in model.state_dict().items() if t.is_floating_point()]
    if not named:
        return []
    finite = torch.stack([torch.isfinite(t).all().to(named[0][1].device) for _, t in named]).tolist()
    return [k for (k, _), ok in zip(named, finite) if not ok]


def _nonfinite_kind(t: torch.Tensor) -> str:
    return "nan" if bool(torch.isnan(t).any()) else "inf"


_PREDICTION_FIX = ("lower the learning rate of the stages that trained it (a client: "
                   "clients.optimizer.init_args.lr, clients.distill_optimizer.init_args.lr; a teacher: "
                   "algorithm.init_args.teacher_optimizer.init_args.lr)")


def _check_targets(targets: torch.Tensor, where: str) -> None:
    """Distillation targets ``[n, M]`` must be finite (they come from checked predictions; this guards the rest).

    Raises:
        DivergenceError: naming ``where`` and how many rows hold a NaN or an infinity.
    """
    rows = ~torch.isfinite(targets).all(dim=1)
    if bool(rows.any()):
        raise DivergenceError(f"{where}: the targets to train on are non-finite ({_nonfinite_kind(targets)}) in "
                              f"{int(rows.sum())} of {len(targets)} rows: the model that produced them diverged; "
                              f"{_PREDICTION_FIX}")


class _StopRequests(pl.Callback):
    """A safe point after every training batch: a SIGTERM/SIGINT whose exception was lost stops the stage there
    (:func:`cosmos_pl.signals.check`; Lightning itself only notices SIGTERM, and only by its own handler)."""

    def on_train_batch_end(self, *args: Any, **kwargs: Any) -> None:
        signals.check()


def _trainer(cfg: TrainerConfig, epochs: int) -> pl.Trainer:
    accelerator = "gpu" if resolve_device(cfg.accelerator).type == "cuda" else "cpu"
    apply_determinism(cfg)
    return pl.Trainer(
        accelerator=accelerator,
        devices=1,
        precision=cfg.precision,
        deterministic=cfg.deterministic,
        benchmark=torch.backends.cudnn.benchmark,
        max_epochs=epochs,
        logger=False,  # one tracking run per experiment, stepped by round (pitfall 12)
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
        num_sanity_val_steps=0,
        log_every_n_steps=1_000_000,
        callbacks=[_StopRequests()],
    )


def fit_supervised(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int,
    batch_size: int,
    optimizer: OptimizerFactory,
    transformations: Transformations | None,
    trainer: TrainerConfig,
    seed: int,
    where: str = "training",
    optimizer_key: str = "",
    part: str = "",
) -> list[dict[str, float]]:
    """Train ``model`` in place with cross-entropy on ``x`` uint8 ``[n, C, H, W]``, ``y`` int64 ``[n]``.

    ``where`` (e.g. ``"round 0, local training, client 3"``) and ``optimizer_key`` (e.g. ``"clients.optimizer"``)
    name the stage and the setting in error messages. ``part``: the dotted name of the submodule trained (``""``:
    the whole model; ``"shared"``: a :class:`~cosmos_pl.models.personal.PersonalAndGlobal`'s copy of the global
    model); parameters with ``requires_grad=False`` stay fixed. Returns one dict per epoch with the mean training
    ``loss``.

    Raises:
        DivergenceError: a step's loss, or the weights after training, are non-finite.
    """
    if epochs <= 0 or len(x) == 0:  # before the module is built: it would set the backbone's memory format
        return []
    trained = model.get_submodule(part) if part else model
    module = SupervisedModule(trained, optimizer, transformations, channels_last=trainer.channels_last, where=where,
                              optimizer_key=optimizer_key)
    return _fit_labelled(model, module, trained, x, y, epochs=epochs, batch_size=batch_size, trainer=trainer,
                         seed=seed)


def _fit_labelled(model: nn.Module, module: CosmosModule, trained: nn.Module, x: torch.Tensor, y: torch.Tensor, *,
                  epochs: int, batch_size: int, trainer: TrainerConfig, seed: int) -> list[dict[str, float]]:
    """Train ``module`` (whose backbone is ``trained``, a part of ``model`` or all of it) on shuffled batches of
    ``(x, y)`` for ``epochs`` >= 1, seeded by ``seed``; ``model`` ends on the CPU. Returns the per-epoch losses."""
    seed_everything(seed, verbose=False)
    _fit(module, trained, trainer, epochs, _loader(_on_device(trainer, x, y), batch_size, shuffle=True))
    model.cpu()
    return module.epoch_parts


def fit_proximal(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int,
    lam: float,
    batch_size: int,
    optimizer: OptimizerFactory,
    transformations: Transformations | None,
    trainer: TrainerConfig,
    seed: int,
    where: str = "training",
    optimizer_key: str = "",
) -> list[dict[str, float]]:
    """Ditto's personal update (Li et al., 2021, Algorithm 1): train ``model.personal`` (v_i) in place on
    ``x`` uint8 ``[n, C, H, W]``, ``y`` int64 ``[n]`` with cross-entropy plus ``lam / 2 * ||v_i - w||^2``, w being
    ``model.shared`` (the client's copy of the global model) as the stage starts, held fixed
    (:class:`~cosmos_pl.modules.ProximalModule`). ``model`` is a
    :class:`~cosmos_pl.models.personal.PersonalAndGlobal`. Returns one dict per epoch (``loss``, ``ce``, ``prox``).

    Raises:
        DivergenceError: a step's loss, or the weights after training, are non-finite.
    """
    if epochs <= 0 or len(x) == 0:
        return []
    anchor = [p.detach() for p in model.shared.parameters()]
    module = ProximalModule(model.personal, anchor, lam, optimizer, transformations,
                            channels_last=trainer.channels_last, where=where, optimizer_key=optimizer_key)
    return _fit_labelled(model, module, model.personal, x, y, epochs=epochs, batch_size=batch_size, trainer=trainer,
                         seed=seed)


def fine_tune(model: nn.Module, x: torch.Tensor, y: torch.Tensor, **kwargs: Any) -> list[dict[str, float]]:
    """FedBABU's personalization (Oh et al., 2022, Section 3): ``model.personal`` becomes a copy of
    ``model.shared`` (the global body with its fixed head), then the whole of it is trained with cross-entropy
    (:func:`fit_supervised`'s arguments, ``part`` aside). ``model`` is a
    :class:`~cosmos_pl.models.personal.PersonalAndGlobal`. Returns one dict per epoch."""
    model.personal.load_state_dict(model.shared.state_dict())
    return fit_supervised(model, x, y, part="personal", **kwargs)


def start_global(model: nn.Module, with_head: bool) -> list[dict[str, float]]:
    """The global model's first local copy is the client's round-0 model: unless ``model.shared`` already holds a
    global model (``model.global_started``), it takes ``model.personal``'s weights (all of them, or the body alone
    when ``with_head`` is False: FedBABU's head stays at its shared initialization). ``model`` is a
    :class:`~cosmos_pl.models.personal.PersonalAndGlobal`; no training, so no losses."""
    if int(model.global_started) == 0:
        state = {k: v for k, v in model.personal.state_dict().items() if with_head or not model.is_head(k)}
        model.shared.load_state_dict(state, strict=False)
        model.global_started.fill_(1)
    return []


def fit_distillation(
    model: nn.Module,
    x: torch.Tensor,
    targets: torch.Tensor,
    *,
    epochs: int,
    batch_size: int,
    optimizer: OptimizerFactory,
    transformations: Transformations | None,
    lam: float,
    num_views: int,
    trainer: TrainerConfig,
    seed: int,
    weights: torch.Tensor | None = None,
    target_grad: bool = False,
    augment: bool = False,
    freeze_bn: bool = False,
    where: str = "training",
    optimizer_key: str = "",
) -> list[dict[str, float]]:
    """Train ``model`` in place on U: ``x`` uint8 ``[n, C, H, W]``, soft ``targets`` ``[n, M]``, Eq. 1/2.

    ``weights`` ``[n]`` are the per-sample w_i(x) of Eq. 2 (default all ones); ``target_grad``, ``augment`` and
    ``freeze_bn`` are :class:`DistillationModule`'s switches; ``where`` and ``optimizer_key`` name the stage and
    the setting in error messages. Returns one dict per epoch with the mean ``loss`` and its parts ``kl`` and
    ``r_b`` (already weighted, before lambda).

    Raises:
        DivergenceError: non-finite targets, a non-finite step loss, or non-finite weights after training.
    """
    if epochs <= 0 or len(x) == 0:
        return []
    _check_targets(targets, where)
    seed_everything(seed, verbose=False)
    w = torch.ones(len(x)) if weights is None else weights.float()
    module = DistillationModule(model, optimizer, transformations, lam=lam, num_views=num_views,
                                channels_last=trainer.channels_last, target_grad=target_grad, augment=augment,
                                freeze_bn=freeze_bn, where=where, optimizer_key=optimizer_key)
    _fit(module, model, trainer, epochs, _loader(_on_device(trainer, x, targets.float(), w), batch_size, shuffle=True))
    model.cpu()
    return module.epoch_parts


class _PairedBatches(Sampler):
    """Index pairs for one epoch over D_i: each step a batch of D_i (a random permutation) with a batch of U
    of the same size, U taken in reshuffled passes so every public sample is used before any repeats."""

    def __init__(self, n_local: int, n_public: int, batch_size: int) -> None:
        self.n_local, self.n_public, self.batch_size = n_local, n_public, batch_size
        # drop a last local batch of 1: BatchNorm cannot train on a single sample
        self.steps = n_local // batch_size if n_local > batch_size and n_local % batch_size == 1 else \
            -(-n_local // batch_size)

    def __len__(self) -> int:
        return self.steps

    def __iter__(self):
        b = self.batch_size
        local = torch.randperm(self.n_local).tolist()
        passes = -(-self.steps * b // self.n_public)
        public = torch.cat([torch.randperm(self.n_public) for _ in range(passes)]).tolist()
        for s in range(self.steps):
            yield local[s * b:(s + 1) * b], public[s * b:(s + 1) * b]


class _JointBatches(Dataset):
    def __init__(self, x: torch.Tensor, y: torch.Tensor, u: torch.Tensor, t: torch.Tensor) -> None:
        self.local, self.public = (x, y), (u, t)

    def __len__(self) -> int:
        return len(self.local[0])

    def __getitem__(self, pair: tuple[list[int], list[int]]) -> tuple[torch.Tensor, ...]:
        li, pi = torch.as_tensor(pair[0]), torch.as_tensor(pair[1])
        return self.local[0][li], self.local[1][li], self.public[0][pi], self.public[1][pi]


def fit_joint(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    public: torch.Tensor,
    targets: torch.Tensor,
    *,
    epochs: int,
    batch_size: int,
    optimizer: OptimizerFactory,
    transformations: Transformations | None,
    lam: float,
    trainer: TrainerConfig,
    seed: int,
    where: str = "training",
    optimizer_key: str = "",
) -> list[dict[str, float]]:
    """Train ``model`` in place on D_i = (``x`` uint8 ``[n_i, C, H, W]``, ``y`` ``[n_i]``) and U = ``public``
    ``[n, C, H, W]`` with soft ``targets`` ``[n, M]``: each step ``CE + lam * KL`` (COMET; :class:`JointModule`).

    An epoch is one pass over D_i; ``where`` and ``optimizer_key`` name the stage and the setting in error
    messages. Returns one dict per epoch with the mean ``loss``, ``ce`` and ``kl``.

    Raises:
        DivergenceError: non-finite targets, a non-finite step loss, or non-finite weights after training.
    """
    if epochs <= 0 or len(x) == 0:
        return []
    _check_targets(targets, where)
    seed_everything(seed, verbose=False)
    module = JointModule(model, optimizer, transformations, lam=lam, channels_last=trainer.channels_last, where=where,
                         optimizer_key=optimizer_key)
    data = _JointBatches(*_on_device(trainer, x, y, public, targets.float()))
    loader = DataLoader(data, sampler=_PairedBatches(len(x), len(public), batch_size), batch_size=None, num_workers=0)
    _fit(module, model, trainer, epochs, loader)
    model.cpu()
    return module.epoch_parts


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
    fix = _PREDICTION_FIX
    if precision.startswith("16"):
        fix += ", or use trainer.precision bf16-mixed or 32-true (float16 overflows above 65504)"
    return DivergenceError(f"{where}: the model's outputs are non-finite ({_nonfinite_kind(logits)}) for "
                           f"{int(rows.sum())} of the inputs {start}..{start + len(logits) - 1} (of {n}); {state}: "
                           f"training diverged; {fix}")


def _batched_logits(model: nn.Module, x: torch.Tensor, trainer: TrainerConfig, where: str = "inference"):
    """Yield ``(start, float logits [b, M])`` per inference batch of ``x``, in order; raise :class:`DivergenceError`
    at the first batch with a non-finite logit.

    A batch that runs the GPU out of memory is retried at half the batch size (and the rest of ``x`` goes at that
    size); at batch size 1 it raises :class:`DeviceMemoryError` naming ``trainer.inference_batch_size``."""
    device = resolve_device(trainer.accelerator)
    apply_determinism(trainer)
    was_training = model.training
    model.eval().to(device)
    if trainer.channels_last:
        model.to(memory_format=torch.channels_last)
    size, start = trainer.inference_batch_size, 0
    try:
        with torch.inference_mode(), _autocast(device, trainer.precision):
            while start < len(x):
                try:
                    logits = model(prepare(x[start : start + size].to(device, non_blocking=True),
                                           channels_last=trainer.channels_last)).float()
                except torch.cuda.OutOfMemoryError:
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


def predict_probs(model: nn.Module, x: torch.Tensor, trainer: TrainerConfig, where: str = "inference") -> torch.Tensor:
    """Soft pseudo-labels ``softmax(model(x))``: uint8 ``[n, C, H, W]`` -> float32 ``[n, M]`` on the CPU.

    Raises:
        DivergenceError: a logit is non-finite; the message starts with ``where`` (e.g. ``"round 1,
            pseudo-labels on U, client 3"``).
    """
    chunks = [logits.softmax(dim=1).cpu() for _, logits in _batched_logits(model, x, trainer, where)]
    return torch.cat(chunks) if chunks else torch.empty(0)


def evaluate(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, num_classes: int, trainer: TrainerConfig,
    where: str = "evaluation",
) -> dict[str, float]:
    """Top-1 (and top-5 where M >= 20) accuracy of ``model`` on ``(x, y)`` as fractions, with torchmetrics;
    NaN (undefined, never 0) on an empty set.

    Raises:
        DivergenceError: a logit is non-finite (an accuracy over NaN outputs would be a silent chance level).
    """
    metrics = {"top1": MulticlassAccuracy(num_classes, top_k=1, average="micro")}
    if num_classes >= 20:
        metrics["top5"] = MulticlassAccuracy(num_classes, top_k=5, average="micro")
    if len(y) == 0:
        return {k: float("nan") for k in metrics}
    for start, logits in _batched_logits(model, x, trainer, where):
        target = y[start : start + len(logits)]
        for m in metrics.values():
            m.update(logits.cpu(), target)
    return {k: float(m.compute()) for k, m in metrics.items()}


def _accuracy(probs: torch.Tensor, y: torch.Tensor, num_classes: int) -> dict[str, float]:
    metrics = {"top1": MulticlassAccuracy(num_classes, top_k=1, average="micro")}
    if num_classes >= 20:
        metrics["top5"] = MulticlassAccuracy(num_classes, top_k=5, average="micro")
    if len(y) == 0:
        return {k: float("nan") for k in metrics}
    return {k: float(m(probs, y)) for k, m in metrics.items()}


def evaluate_models(models: dict[str, nn.Module], x: torch.Tensor, y: torch.Tensor, num_classes: int,
                    trainer: TrainerConfig, where: str = "evaluation", class_counts: torch.Tensor | None = None,
                    public: torch.Tensor | None = None) -> dict[str, dict[str, float]]:
    """Test accuracies of several models for one client (its own f_i, its cluster teacher h_pi(i), ...), by name.

    With ``class_counts`` (``[M]``, the client's training labels) and ``public`` (U, uint8 ``[n, C, H, W]``), a
    ``"teacher"`` is also scored as the client would use it, ``"teacher_prior"``: its probabilities on ``x`` shifted
    to the client's label prior (:func:`cosmos_pl.losses.adjust_to_prior`, the teacher's mean output on U as the
    prior it carries). Reported beside the teacher's own accuracy, never instead of it.

    Raises:
        DivergenceError: a model's logit is non-finite; the message names ``where`` and the model's name.
    """
    shifted = models.get("teacher") is not None and class_counts is not None and public is not None and len(public)
    out = {name: evaluate(model, x, y, num_classes, trainer, f"{where}, {name} model")
           for name, model in models.items() if not (shifted and name == "teacher")}
    if shifted:  # the teacher's logits on x once, for both of its scores
        from cosmos_pl.losses import adjust_to_prior

        teacher = models["teacher"]
        logits = torch.cat([b for _, b in _batched_logits(teacher, x, trainer, f"{where}, teacher model")]) \
            if len(y) else torch.empty(0, num_classes)
        out["teacher"] = _accuracy(logits.cpu(), y, num_classes)
        carried = predict_probs(teacher, public, trainer, f"{where}, teacher on U").mean(dim=0)
        adjusted = adjust_to_prior(logits.cpu().softmax(dim=1), class_counts, carried) if len(y) else logits
        out["teacher_prior"] = _accuracy(adjusted, y, num_classes)
    return {name: out[name] for name in [*models, "teacher_prior"] if name in out}
