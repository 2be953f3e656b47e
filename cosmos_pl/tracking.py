"""Weights & Biases: one run per experiment, stepped by round (not one per Trainer, whose step restarts at 0),
offline unless asked otherwise."""

from __future__ import annotations

import inspect
import os
import warnings
from pathlib import Path
from typing import Any

from cosmos_pl.errors import TrackingError

__all__ = ["Tracker", "INIT_TIMEOUT_S"]

# Seconds wandb.init may take to reach the server in online mode before the run stops with a one-line error
# (wandb's own default is 90 s, then retries); the WANDB_INIT_TIMEOUT environment variable overrides it.
INIT_TIMEOUT_S = 30.0
_OFFLINE_HINT = "pass --wandb.mode offline (sync later with `wandb sync`) or --wandb.mode disabled"


def _has_credentials(wandb: Any) -> bool:
    """Whether wandb finds an API key (environment, .netrc, settings) or an identity token, without prompting
    and without the network."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    if "prompt" in inspect.signature(wandb.login).parameters:  # newer wandb: looks without asking
        return bool(wandb.login(prompt=False, verify=False))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return bool(wandb.api.api_key)


def _init_timeout() -> float:
    text = os.environ.get("WANDB_INIT_TIMEOUT", str(INIT_TIMEOUT_S))
    try:
        return float(text)
    except ValueError:
        raise TrackingError(f"WANDB_INIT_TIMEOUT={text!r}: give seconds as a number, e.g. 30") from None


class Tracker:
    """A thin wrapper over one ``wandb`` run; with mode 'disabled' nothing is imported or written.

    Args:
        mode: 'offline', 'online' or 'disabled'.
        run_dir: the run directory; W&B files go to ``run_dir/wandb``.
        config: the resolved experiment config (a plain dict).
        project: the W&B project, passed to ``wandb.init``.
        entity: the W&B entity (team or user); None: your default.
        name: the run's name; None: the run directory's name.
        tags: the run's tags.
        run_id: continue this W&B run (``cosmos-pl fit --resume``: the id kept in the checkpoint); None: a new run.
        group: the W&B run group (``compare`` sets the comparison's name, so W&B's run table groups its runs).
        job_type: the W&B job type (``compare`` sets the algorithm's short name; its table run 'comparison').
        by_round: step every logged value by ``round`` (a run's rounds); False for a run without rounds (a
            comparison's table run).

    Raises:
        TrackingError: wandb cannot start: not installed, no API key in online mode, the server not reached
            within ``WANDB_INIT_TIMEOUT`` (default :data:`INIT_TIMEOUT_S`) seconds, or refused by it. The
            message suggests offline mode.
    """

    def __init__(self, mode: str, run_dir: Path, config: dict[str, Any], project: str,
                 entity: str | None, name: str | None, tags: list[str], run_id: str | None = None,
                 group: str | None = None, job_type: str | None = None, by_round: bool = True) -> None:
        self.run = None
        if mode == "disabled":
            return
        try:
            import wandb
        except ImportError as err:
            raise TrackingError(f"wandb.mode={mode!r}: wandb cannot be imported ({err}); reinstall it "
                                f"(pip install 'wandb>=0.19.9') or pass --wandb.mode disabled") from None

        os.environ.setdefault("WANDB_SILENT", "true")
        if mode == "online" and not _has_credentials(wandb):
            # checked here: wandb.init would otherwise prompt for a key, or fail with a traceback
            raise TrackingError(f"wandb.mode='online' but no W&B API key is set (WANDB_API_KEY, or `wandb login`); "
                                f"log in, or {_OFFLINE_HINT}")
        timeout = _init_timeout()
        try:
            self.run = wandb.init(
                mode=mode, dir=str(run_dir), project=project, entity=entity,
                name=name or run_dir.name, tags=tags, config=config, reinit="finish_previous", group=group,
                job_type=job_type,
                settings=wandb.Settings(init_timeout=timeout),
                **({"id": run_id, "resume": "allow"} if run_id else {}),
            )
        except wandb.errors.Error as err:  # no network, a timeout, a refused key, a bad entity or project
            reason = " ".join(str(err).split())[:300]
            raise TrackingError(f"wandb.mode={mode!r}: W&B did not start ({type(err).__name__}: {reason}); "
                                f"{_OFFLINE_HINT}; on a slow network raise WANDB_INIT_TIMEOUT (now {timeout:g} s)"
                                ) from None
        if by_round:
            self.run.define_metric("round")
            self.run.define_metric("*", step_metric="round")

    @property
    def run_id(self) -> str | None:
        """The W&B run's id (None when tracking is disabled)."""
        return None if self.run is None else self.run.id

    def log_round(self, row: dict[str, Any]) -> None:
        if self.run is not None:
            self.run.log({k: v for k, v in row.items() if isinstance(v, (int, float)) and v is not None})

    def log_table(self, key: str, columns: list[str], rows: list[list[Any]]) -> None:
        """Log ``rows`` (one list per row, in ``columns`` order) as the W&B table ``key``."""
        if self.run is not None:
            import wandb

            self.run.log({key: wandb.Table(columns=columns, data=rows)})

    def summary(self, summary: dict[str, Any]) -> None:
        if self.run is not None:
            for key in ("final", "best", "local_only"):
                if key in summary:
                    self.run.summary[key] = summary[key]

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None
