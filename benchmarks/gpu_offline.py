"""What ``benchmarks/gpu_check.sh --offline`` needs on a GPU machine without network, beyond that machine's own
Python: the wheels it carries in, the check of that Python, and (for ``--dry-run --offline`` here) a Python that
sees no more than such a machine would.

``python benchmarks/gpu_offline.py download [DIR]`` (``make gpu-wheels``): the pure-Python wheels of
:data:`CARRIED`, pinned to the versions installed in this Python, into DIR (default ``benchmarks/wheels``, ignored
by git; about 1 MB), removing any other version of them there (two versions of one package stop the install).
``check`` (``gpu_check.py --offline --check`` runs it first): on the GPU machine, import every module of
:data:`MACHINE` and :data:`CARRIED` and parse ``cosmos-pl fit --help``; their versions on one line, or exit status 2
naming what is missing.
``guard DIR [--site SITE]``: write ``DIR/sitecustomize.py``, which (with DIR first on ``PYTHONPATH``) hides from
every import, and from ``importlib.metadata``, each installed distribution outside :func:`allowed` (what
:data:`MACHINE` and :data:`CARRIED` need, as installed here), and with SITE the carried packages everywhere but in
SITE; spawned workers start with the same ``PYTHONPATH`` and are hidden from alike.

The machine's own packages are an assumption of the offline check, not something it installs: torch with CUDA,
torchvision, Lightning, timm, torchmetrics, scikit-learn, SciPy, NumPy, PyYAML, Matplotlib, Pillow, rich, pytest and
filelock (an image with PyTorch and Lightning has them). wandb, submitit, Flower and cryptography are imported only
by W&B logging, Slurm launches and Flower deployments, which the check does not use.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WHEELS = REPO / "benchmarks" / "wheels"

#: distribution -> import name: what the machine's Python must already have (cosmos-pl's run-time dependencies
#: less the carried and the lazily imported ones, and what the cuda tests import)
MACHINE = {"torch": "torch", "torchvision": "torchvision", "lightning": "lightning", "timm": "timm",
           "torchmetrics": "torchmetrics", "rich": "rich", "numpy": "numpy", "scikit-learn": "sklearn",
           "scipy": "scipy", "pyyaml": "yaml", "matplotlib": "matplotlib", "pillow": "PIL", "pytest": "pytest",
           "filelock": "filelock"}
#: distribution -> import name: carried in as wheels (``jsonargparse[signatures]`` and what it needs beyond
#: :data:`MACHINE`); pure Python, so one wheel serves every Python 3 and platform
CARRIED = {"jsonargparse": "jsonargparse", "docstring-parser": "docstring_parser", "typeshed-client": "typeshed_client"}


def canonical(name: str) -> str:
    """A distribution's name as PEP 503 compares them (``Docstring_Parser`` -> ``docstring-parser``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pins() -> list[str]:
    """``name==version`` of each :data:`CARRIED` distribution as installed in this Python.

    Raises:
        SystemExit: one is not installed here (then there is nothing to pin it to)."""
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for dist in CARRIED:
        try:
            out.append(f"{dist}=={version(dist)}")
        except PackageNotFoundError:
            raise SystemExit(f"gpu_offline: {dist} is not installed in {sys.executable}; run this with the "
                             "project's Python (.venv/bin/python, after make venv)") from None
    return out


def download(dest: Path) -> list[Path]:
    """Download the :func:`pins` wheels into ``dest`` (``pip download --no-deps --only-binary=:all:`` from pip's
    configured index) and remove every other wheel of the same packages there (:func:`prune`); returns the wheels.

    Raises:
        SystemExit: pip failed, or :func:`prune`'s."""
    dest.mkdir(parents=True, exist_ok=True)
    wanted = pins()
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
                           "--no-deps", "--only-binary=:all:", "--dest", str(dest), *wanted])
    if done.returncode:
        raise SystemExit(f"gpu_offline: pip download {' '.join(wanted)} failed (exit {done.returncode})")
    wheels = prune(dest, wanted)
    size = sum(w.stat().st_size for w in wheels)
    print(f"{len(wheels)} wheels, {size / 2**20:.1f} MiB in {dest}: " + ", ".join(w.name for w in wheels))
    return wheels


def prune(dest: Path, wanted: list[str]) -> list[Path]:
    """Remove from ``dest`` every wheel of a ``wanted`` package (``name==version``) at another version; returns
    the wanted wheels there, by name. Other files are left alone.

    Raises:
        SystemExit: a wanted wheel is not pure Python (``py3-none-any``), or one is missing."""
    keep = {canonical(p.split("==")[0]): p.split("==")[1] for p in wanted}
    wheels = []
    for wheel in sorted(dest.glob("*.whl")):
        name, ver = wheel.name.split("-")[:2]
        if canonical(name) not in keep:
            continue
        if ver != keep[canonical(name)]:
            wheel.unlink()  # another version: pip install would refuse two of one package
            continue
        if not wheel.name.endswith("-py3-none-any.whl"):
            raise SystemExit(f"gpu_offline: {wheel.name} is not a pure-Python wheel; it would not install on "
                             "every GPU machine")
        wheels.append(wheel)
    if len(wheels) != len(keep):
        raise SystemExit(f"gpu_offline: {dest} holds {', '.join(w.name for w in wheels) or 'none'} of "
                         f"{', '.join(wanted)}")
    return wheels


def check() -> int:
    """Import each package the offline check needs and parse ``cosmos-pl fit --help``; print their versions (and
    torch's CUDA and cuDNN), or on stderr what is missing and how to bring it. Returns 0, or 2 when something is
    missing or fails to import, or the help fails."""
    import contextlib
    import importlib
    import io
    from importlib.metadata import PackageNotFoundError, version

    missing, found = [], []
    for dist, module in {**MACHINE, **CARRIED}.items():
        try:
            importlib.import_module(module)
        except Exception as err:  # not installed, or installed but broken (a wrong torch build, say)
            missing.append(f"{dist} ({type(err).__name__}: {err})")
            continue
        try:
            found.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            found.append(f"{dist} (version unknown)")
    print(f"{sys.executable}: " + ", ".join(found))
    if "torch" in {f.split()[0] for f in found}:
        import torch

        print(f"torch {torch.__version__}: built for CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}")
    if missing:
        carried = [m for m in missing if m.split()[0] in CARRIED]
        fix = ("carry benchmarks/wheels (make gpu-wheels on a machine with network)" if carried else
               f"install them into {sys.executable}'s environment, or name another Python with PY=")
        print(f"gpu_check: error: this Python lacks {'; '.join(missing)}: {fix}", file=sys.stderr)
        return 2
    from cosmos_pl.cli import main

    with contextlib.redirect_stdout(io.StringIO()) as text:
        try:
            status = main(["fit", "--help"])
        except SystemExit as stop:  # --help exits through argparse
            status = stop.code
    if status not in (0, None) or "--algorithm" not in text.getvalue():
        print(f"gpu_check: error: cosmos-pl fit --help failed (exit {status})", file=sys.stderr)
        return 2
    print("cosmos-pl fit --help: parsed")
    return 0


def allowed() -> set[str]:
    """The canonical names of :data:`MACHINE` and :data:`CARRIED` with every distribution they require (markers
    evaluated for this Python, no extras), as installed in this Python, and cosmos-pl itself (not what it requires:
    whether it imports more is what the dry run checks)."""
    from importlib.metadata import PackageNotFoundError, distribution

    from packaging.requirements import Requirement

    seen: set[str] = set()
    todo = [*MACHINE, *CARRIED]
    while todo:
        name = canonical(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = distribution(name).requires or []
        except PackageNotFoundError:
            continue
        for line in requires:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen | {"cosmos-pl"}


GUARD = '''"""Written by benchmarks/gpu_offline.py guard: this Python sees only what an offline GPU machine has."""
import sys
from importlib.machinery import PathFinder

_HIDDEN_MODULES = frozenset({modules!r})
_HIDDEN_DISTS = frozenset({dists!r})
_SITE = {site!r}
_CARRIED_MODULES = frozenset({carried_modules!r})
_CARRIED_DISTS = frozenset({carried_dists!r})


def _name(dist):
    import re

    return re.sub(r"[-_.]+", "-", getattr(dist, "_normalized_name", None) or dist.metadata["Name"]).lower()


class OfflineMachineFinder(PathFinder):
    """sys.path's finder, blind to the hidden packages (and to the carried ones outside _SITE)."""

    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if path is None and fullname in _HIDDEN_MODULES:
            return None
        if path is None and _SITE and fullname in _CARRIED_MODULES:
            return PathFinder.find_spec(fullname, [_SITE], target)
        return PathFinder.find_spec(fullname, path, target)

    @classmethod
    def find_distributions(cls, *args, **kwargs):
        for dist in PathFinder.find_distributions(*args, **kwargs):
            name = _name(dist)
            if name in _HIDDEN_DISTS:
                continue
            if _SITE and name in _CARRIED_DISTS and not str(getattr(dist, "_path", "")).startswith(_SITE):
                continue
            yield dist


sys.meta_path[:] = [OfflineMachineFinder if f is PathFinder else f for f in sys.meta_path]
'''


def guard(folder: Path, site: Path | None) -> Path:
    """Write ``folder/sitecustomize.py`` (see the module's docstring); returns its path. With ``site``, the
    :data:`CARRIED` packages are found only there (as installed from the wheels); without, this Python's own
    copies of them serve."""
    from importlib.metadata import packages_distributions

    keep = allowed()
    tops = packages_distributions()
    hidden_modules = sorted(t for t, dists in tops.items() if not any(canonical(d) in keep for d in dists))
    hidden_dists = sorted({canonical(d) for dists in tops.values() for d in dists} - keep)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "sitecustomize.py"
    path.write_text(GUARD.format(modules=hidden_modules, dists=hidden_dists,
                                 site=str(site.resolve()) if site else None,
                                 carried_modules=sorted(CARRIED.values()), carried_dists=sorted(CARRIED)))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    down = sub.add_parser("download", help="the carried wheels into DIR (make gpu-wheels)")
    down.add_argument("dest", nargs="?", type=Path, default=WHEELS)
    sub.add_parser("check", help="this Python has what the offline check needs")
    hide = sub.add_parser("guard", help="write DIR/sitecustomize.py hiding what an offline machine lacks")
    hide.add_argument("folder", type=Path)
    hide.add_argument("--site", type=Path, default=None, help="where the carried wheels were installed")
    args = parser.parse_args(argv)
    if args.command == "download":
        download(args.dest)
        return 0
    if args.command == "check":
        return check()
    hidden = guard(args.folder, args.site)
    print(f"dry run as an offline machine: {hidden} hides every package outside {len(allowed())} distributions "
          f"(torch, Lightning, ... and what they require, as installed here)"
          + (f"; jsonargparse and co. from {args.site} only" if args.site else
             "; jsonargparse and co. from this Python (no benchmarks/wheels: make gpu-wheels to check the wheels)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
