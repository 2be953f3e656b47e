"""``cosmos-pl export-partition``: the federation a ``fit`` config makes, written as one folder per site."""

from __future__ import annotations

from pathlib import Path

from jsonargparse import Namespace

from cosmos_pl.config import validate_config
from cosmos_pl.errors import ConfigError
from cosmos_pl.parsers import build_export_parser

__all__ = ["run_export"]


def run_export(cfg: Namespace) -> list[Path]:
    """``cosmos-pl export-partition``: build the federation without a validation split (each partition whole:
    every site carves its own, seeded from (seed, client)) and write it (:func:`cosmos_pl.data.export_federation`).

    Raises:
        ConfigError: ``--out`` is a file or a folder with files in it.
    """
    import dataclasses

    from cosmos_pl.data import export_federation

    out = Path(cfg.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--out={cfg.out!r}: {'is a file' if out.is_file() else 'is not empty'}; give a new or "
                          "empty folder")
    init = build_export_parser().instantiate(cfg)
    validate_config(init)
    _, federation = dataclasses.replace(init.data, validation_fraction=0.0).build(init.seed)
    folders = export_federation(federation, out)
    print(f"cosmos-pl: {len(folders)} site folders in {out} (client_0 .. client_{len(folders) - 1}), U "
          f"({len(federation.public)} images) and the class list in {out / 'public.npz'}")
    return folders
