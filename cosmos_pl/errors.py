"""The errors a user can fix, apart from faults in cosmos-pl itself.

``cosmos-pl`` prints a :class:`UserError` as one line (``cosmos-pl: error: ...``) and exits with status 2; any
other exception is an internal fault: a traceback, a pointer to report it, exit status 1. Every user error's
message names the setting (dotted key) or the client, the value, and the fix.
"""

from __future__ import annotations

from typing import Any

__all__ = ["UserError", "ConfigError", "DataError", "DivergenceError", "DeviceMemoryError", "DeviceError",
           "TrackingError", "check"]


class UserError(Exception):
    """A mistake in the settings, the data or the environment that the user can fix (CLI: one line, exit 2)."""


class ConfigError(UserError, ValueError):
    """A setting's value is not allowed. The message names the dotted key, the value and what is allowed."""


class DataError(UserError, ValueError):
    """A data set or a partition that cannot be trained on (wrong shapes or labels, a client without data)."""


class DivergenceError(UserError, FloatingPointError):
    """Training produced a non-finite loss or non-finite predictions; names the round, stage and client."""


class DeviceMemoryError(UserError, MemoryError):
    """The GPU ran out of memory in a stage: the run stops (it is never a client's failure, which would drop
    clients for a setting); names the round, stage and client, the batch size, and the settings to lower."""


class DeviceError(UserError, RuntimeError):
    """A CUDA error left the GPU context of the process running the tasks unusable (a device-side assert, an illegal
    memory access, a launch failure): with the tasks in the main process the run stops, since every later task would
    fail the same way (a worker that hits one is replaced instead); names the error and what to try."""


class TrackingError(UserError, RuntimeError):
    """Experiment tracking (Weights & Biases) cannot start: no API key, no network, a broken install."""


def check(ok: bool, key: str, value: Any, allowed: str) -> None:
    """Raise :class:`ConfigError` ``"{key}={value!r}: {allowed}"`` unless ``ok``.

    Example: ``check(lr > 0, "clients.optimizer.init_args.lr", lr, "must be > 0")``.
    """
    if not ok:
        raise ConfigError(f"{key}={value!r}: {allowed}")
