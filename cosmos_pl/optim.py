"""The type of every optimizer setting (``clients.optimizer``, COSMOS's ``teacher_optimizer``, ...).

A callable that takes the parameters and returns a torch optimizer, as in configs' ``{class_path:
torch.optim.Adam, init_args: {lr: 1e-3}}``: the same type as Lightning's ``lightning.pytorch.cli.OptimizerCallable``,
defined here so that the settings can be read and checked without importing Lightning's trainer stack.
"""

from collections.abc import Iterable
from typing import Callable

from torch.optim import Optimizer

__all__ = ["OptimizerCallable"]

OptimizerCallable = Callable[[Iterable], Optimizer]
