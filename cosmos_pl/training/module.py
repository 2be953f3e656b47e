"""The base LightningModule of every objective: a backbone fed uint8 batches that it normalizes and transforms on the
device; each objective (:mod:`cosmos_pl.objectives`) subclasses it with its ``training_step``.

Every step's loss is checked to be finite: a non-finite loss stops training with a
:class:`~cosmos_pl.errors.DivergenceError` that names the stage, the epoch and step, and the optimizer setting to
lower.
"""

from __future__ import annotations

from typing import Callable, Iterable

import lightning.pytorch as pl
import torch
from torch import nn

from cosmos_pl.errors import DivergenceError
from cosmos_pl.transforms import Transformations, prepare

__all__ = ["LARGE_LAMBDA", "CosmosModule", "OptimizerFactory", "default_optimizer"]

OptimizerFactory = Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]


def default_optimizer(lr: float) -> OptimizerFactory:
    """Adam at ``lr``: 1e-3 on labels, 1e-4 on pseudo-labels (COSMOS paper, Appendix C)."""

    def make(params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.Adam(params, lr=lr)

    return make


def _sum(values: list[torch.Tensor]) -> torch.Tensor:
    """Step by step, in order (the float32 sum the epoch means have always been taken from)."""
    total = values[0]
    for v in values[1:]:
        total = total + v
    return total


#: A loss weight lambda above this is named among the settings to lower when training diverges (papers: 1 to 5).
LARGE_LAMBDA = 100.0


class CosmosModule(pl.LightningModule):
    """A backbone with its optimizer; subclasses define ``training_step`` for one objective.

    Args:
        backbone: maps float ``[B, C, H, W]`` in [-1, 1] to logits ``[B, M]``.
        optimizer: called with the parameters, returns the optimizer (a jsonargparse/Lightning OptimizerCallable).
        transformations: the permissible transformations T and radius d (None: no augmentation).
        channels_last: run the backbone in channels-last memory format (faster convolutions).
        where: the stage in error messages, e.g. ``"round 1, client distillation, client 3"``.
        optimizer_key: the dotted config key of ``optimizer`` in error messages, e.g. ``"clients.optimizer"``
            ("": none, the message then says "the optimizer's learning rate").

    Raises:
        DivergenceError: during training, a step's loss is non-finite (checked every step on the CPU, every
            :attr:`CHECK_EVERY` steps and at each epoch's end on a GPU, where a check waits for the device).
    """

    #: On a GPU, the losses are checked on the host every this many steps (and at each epoch's end).
    CHECK_EVERY = 32

    def __init__(
        self,
        backbone: nn.Module,
        optimizer: OptimizerFactory,
        transformations: Transformations | None = None,
        *,
        channels_last: bool = False,
        where: str = "training",
        optimizer_key: str = "",
    ) -> None:
        super().__init__()
        self.channels_last = channels_last
        self.where, self.optimizer_key = where, optimizer_key
        self.backbone = backbone.to(memory_format=torch.channels_last) if channels_last else backbone
        self.optimizer_factory = optimizer
        self.transformations = transformations
        self.epoch_losses: list[float] = []
        self.epoch_parts: list[dict[str, float]] = []
        self._steps: dict[str, list[torch.Tensor]] = {}  # this epoch's per-step values, kept on the device
        self._checked = 0  # steps of this epoch already checked finite
        self._optimizer_settings: dict[str, float] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """uint8 ``[B, C, H, W]`` -> logits ``[B, M]`` on clean (untransformed) inputs."""
        return self.backbone(self.prepare(x))

    def prepare(self, x: torch.Tensor, transform: bool = False, perturb: bool = False) -> torch.Tensor:
        """uint8 batch -> model input; ``transform`` applies T, ``perturb`` draws x' in B(x)."""
        t = self.transformations if (transform or perturb) else None
        return prepare(x, t, perturb=perturb, channels_last=self.channels_last)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        # frozen parameters (FedBABU's head) stay out of the optimizer
        optimizer = self.optimizer_factory([p for p in self.parameters() if p.requires_grad])
        group = optimizer.param_groups[0]
        self._optimizer_settings = {k: float(group[k]) for k in ("lr", "weight_decay")
                                    if isinstance(group.get(k), (int, float, torch.Tensor))}
        return optimizer

    def _track(self, loss: torch.Tensor, **parts: torch.Tensor) -> None:
        """Keep the step's total loss and its named parts (e.g. ``kl``, ``r_b``) on the device, and check the
        losses so far are finite (every step on the CPU; on a GPU every :attr:`CHECK_EVERY` steps, so the
        device rarely waits for the host)."""
        for name, value in {"loss": loss, **parts}.items():
            self._steps.setdefault(name, []).append(value.detach().float())
        if loss.device.type == "cpu" or len(self._steps["loss"]) % self.CHECK_EVERY == 0:
            self._check_losses()

    def _check_losses(self) -> None:
        """Raise :class:`DivergenceError` at the first unchecked step of this epoch whose loss is not finite."""
        losses = self._steps.get("loss", [])[self._checked:]
        if not losses:
            return
        bad = ~torch.isfinite(torch.stack(losses))
        if bool(bad.any()):
            step = self._checked + int(bad.nonzero()[0, 0])
            values = {name: float(v[step]) for name, v in self._steps.items()}
            parts = ", ".join(f"{k} {v:.4g}" for k, v in values.items() if k != "loss")
            trainer = self._trainer
            epochs = f" of {trainer.max_epochs}" if trainer is not None else ""
            steps = trainer.num_training_batches if trainer is not None else None
            of_steps = f" of {steps}" if isinstance(steps, int) else ""
            raise self.diverged(f"the training loss is {values['loss']}{f' ({parts})' if parts else ''} at epoch "
                                f"{self.current_epoch + 1}{epochs}, step {step + 1}{of_steps}")
        self._checked += len(losses)

    def diverged(self, problem: str) -> DivergenceError:
        """A :class:`DivergenceError` ``"{where}: {problem}: training diverged; lower ..."`` naming the optimizer's
        dotted keys and their values (learning rate, and weight decay when it is on), a loss weight lambda above
        :data:`LARGE_LAMBDA`, and a float16 precision."""
        settings, key = self._optimizer_settings, self.optimizer_key
        fix = f"lower the learning rate {key}.init_args.lr" if key else "lower the optimizer's learning rate"
        if "lr" in settings:
            fix += f" (now {settings['lr']:g})"
        if settings.get("weight_decay", 0) > 0:
            fix += f" or the weight decay{f' {key}.init_args.weight_decay' if key else ''} " \
                   f"(now {settings['weight_decay']:g})"
        fix += self._more_fixes()
        precision = str(getattr(self._trainer, "precision", "")) if self._trainer is not None else ""
        if precision.startswith("16"):
            fix += ", or use trainer.precision bf16-mixed or 32-true (float16 overflows above 65504)"
        return DivergenceError(f"{self.where}: {problem}: training diverged; {fix}")

    def _more_fixes(self) -> str:
        """Other settings of this objective worth lowering after a divergence (``", or ..."``; none here)."""
        return ""

    def on_train_epoch_end(self) -> None:
        self._check_losses()
        if self._steps:
            means = {name: float(_sum(values)) / len(values) for name, values in self._steps.items()}
            self.epoch_losses.append(means["loss"])
            self.epoch_parts.append(means)
        self._steps = {}
        self._checked = 0
