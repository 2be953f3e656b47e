"""The run directory: one run's files, each written atomically (temp file + rename), so none is ever half-written.

A run directory holds one run only: :meth:`RunDirectory.prepare` refuses a folder that already holds another run's
files unless told to overwrite them (then it removes every one of them first, its checkpoints included), and
:meth:`RunDirectory.unique` makes a new folder that no other run has, even for runs started in the same second.
Both take the folder's lock (:class:`~cosmos_pl.runs.locks.FolderLock`) before looking inside, so a second
process on a folder in use is refused instead of mixing its files with the first's. Files get the usual
permissions (``0o666`` less the umask), like any file the user creates. A write that fails for lack of space or
permission is a :class:`~cosmos_pl.errors.UserError` naming the file (:class:`WriteFailed`), not a traceback.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any, Optional

from cosmos_pl.errors import ConfigError
from cosmos_pl.runs.locks import FolderLock, unwritable
from cosmos_pl.files import WriteFailed, atomic_save, atomic_save_figure, atomic_write_text

__all__ = ["RunDirectory", "RESULT_FILES", "RUN_FILES", "WriteFailed", "create_folder", "atomic_write_text",
           "atomic_save", "atomic_save_figure"]

# What marks a folder as holding a run (what compare and the refusal look for).
RESULT_FILES = ("config.yaml", "partition.json", "clusters.json", "metrics.csv", "clients.csv", "summary.json")
# Everything a run writes: --overwrite removes all of it, so nothing of the old run is left (compare's pair.yaml
# and log.txt, and any file of the user's, are not a run's and stay).
RUN_FILES = (*RESULT_FILES, "accuracy_vs_round.png", "traffic.csv", "nodes.json", "checkpoints", "wandb")

def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None  # JSON has no NaN; null means "not defined" (e.g. teacher accuracy at round 0)
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "tolist"):
        return _jsonable(value.tolist())
    return value


def create_folder(path: Path, key: str) -> None:
    """``path.mkdir(parents=True, exist_ok=True)``; a file in the way, or no permission, is a ConfigError."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        what = "is an existing file" if path.is_file() else f"cannot be created ({err.strerror or err})"
        raise ConfigError(f"{key}={str(path)!r}: {what}; give a folder path you can write to") from None


class RunDirectory:
    """Files of one experiment: config.yaml, partition.json, clusters.json, metrics.csv, clients.csv, summary.json.

    ``RunDirectory(path)`` uses ``path`` as it is (creating it); a run started from the CLI gets its folder from
    :meth:`prepare`, :meth:`unique` or :meth:`resume`, which lock it and make sure no other run's files are in it.
    :meth:`release` drops the lock (the end of the process does too). A run that fails before its training begins
    removes what it wrote with :meth:`remove_failed_start`, so the same folder can be used again.
    """

    def __init__(self, path: str | Path, lock: Optional[FolderLock] = None) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.lock = lock
        # the run files there before this run (a resumed run's own): never removed by remove_failed_start
        self._there_before = {name for name in RUN_FILES if (self.path / name).exists()}
        self.training = False  # set by the run once every check passed and training begins

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()

    def remove_failed_start(self) -> list[str]:
        """Remove the run files (:data:`RUN_FILES`) written since this folder was opened: what a run that failed
        before its training began leaves (config.yaml, a W&B folder, ...), which would otherwise make the same
        folder refused as another run's. Files there before (a resumed run's) and files that are not a run's are
        kept. Best effort: a file that cannot be removed is left (the run's own error is what matters).

        Returns:
            The names removed, in :data:`RUN_FILES` order.
        """
        removed = []
        for name in RUN_FILES:
            target = self.path / name
            if name in self._there_before or not (target.exists() or target.is_symlink()):
                continue
            try:
                shutil.rmtree(target) if target.is_dir() and not target.is_symlink() else target.unlink()
            except OSError:
                continue
            removed.append(name)
        return removed

    @classmethod
    def prepare(cls, path: str | Path, *, overwrite: bool = False, key: str = "--run_dir") -> RunDirectory:
        """The folder ``path`` for a new run, created if missing and locked.

        Raises:
            ConfigError: ``path`` is a file (or lies under one) or cannot be created; or it holds another run's
                files (:data:`RUN_FILES`) and ``overwrite`` is false. With ``overwrite`` every one of them is
                removed first (checkpoints and ``wandb/`` included, so a new run can only ever resume from its
                own checkpoints); other files (e.g. compare's pair.yaml) are kept.
            FolderInUse: another process holds the folder.
            UserError: the folder cannot be written.
        """
        path = Path(path)
        create_folder(path, key)
        lock = FolderLock(path, key).acquire()  # before looking inside: another run may be writing there
        try:
            found = [name for name in RUN_FILES if (path / name).exists()]
            if found and not overwrite:
                # a run that ended before its first checkpoint (a divergence in round 0, say) has nothing to resume
                unfinished = "summary.json" not in found and not any((path / "checkpoints").glob("*.pt"))
                what = ("a run that stopped before its first checkpoint, so it cannot be resumed" if unfinished
                        else "another run")
                raise ConfigError(f"{key}={str(path)!r}: already holds the files of {what} "
                                  f"({', '.join(found)}); choose a new {key}, or pass --overwrite true to replace "
                                  "them")
            for name in found:
                target = path / name
                try:
                    shutil.rmtree(target) if target.is_dir() and not target.is_symlink() else target.unlink()
                except OSError as err:
                    raise unwritable(path, key, err) from None
        except BaseException:
            lock.release()
            raise
        return cls(path, lock)

    @classmethod
    def resume(cls, path: str | Path, key: str = "--resume") -> RunDirectory:
        """An existing run's folder, locked for the resumed run.

        Raises:
            FolderInUse: another process holds the folder (the run is still going, or another resume of it is).
            UserError: the folder cannot be written.
        """
        return cls(path, FolderLock(path, key).acquire())

    @classmethod
    def unique(cls, base: str | Path, key: str = "--run_dir") -> RunDirectory:
        """A new, empty, locked folder ``base``, or ``base-2``, ``base-3``, ... when that exists: created
        atomically (``mkdir`` without ``exist_ok``), so two runs started in the same second never share one."""
        base = Path(base)
        create_folder(base.parent, key)
        for n in range(1, 10_000):
            path = base if n == 1 else base.with_name(f"{base.name}-{n}")
            try:
                path.mkdir()
            except FileExistsError:
                continue
            except OSError as err:
                raise unwritable(base.parent, key, err) from None
            return cls(path, FolderLock(path, key).acquire())
        raise ConfigError(f"{key}: no free folder name after {base}-9999; pass --run_dir")

    def write_text(self, name: str, text: str) -> Path:
        target = self.path / name
        atomic_write_text(target, text)
        return target

    def write_json(self, name: str, data: Any) -> Path:
        return self.write_text(name, json.dumps(_jsonable(data), indent=2, sort_keys=False) + "\n")
