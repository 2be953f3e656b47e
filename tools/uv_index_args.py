"""Print the ``uv pip install`` flags that make uv read the same package indexes as this machine's pip.

uv does not read pip's configuration files or its ``PIP_*`` variables; pip's settings for where packages come from
(``index-url``, ``extra-index-url``, ``find-links``, ``constraint``, from ``pip config list``: its files and its
environment variables, which win as in pip) become uv's flags, one per value. ``--index-strategy
unsafe-best-match`` makes uv pick the best version over every index, as pip does (uv's default takes the first
index that has the package). With no pip configuration it prints only that flag: uv then uses PyPI, as pip would.

Run by the Makefile with the virtual environment's python; standard library only.
"""

import shlex
import subprocess
import sys

# pip's option -> uv's flag; each value may hold several entries separated by whitespace (pip's own rule)
FLAGS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
         "constraint": "--constraint"}


def pip_settings(listing: str) -> dict[str, str]:
    """``{option: value}`` from ``pip config list`` output (lines ``scope.option='value'``): an environment
    variable (scope ``:env:``) wins over the files, as in pip; among the files the last line listed wins."""
    files: dict[str, str] = {}
    env: dict[str, str] = {}
    for line in listing.splitlines():
        key, sep, value = line.partition("=")
        scope, _, option = key.rpartition(".")
        if sep and option in FLAGS:
            (env if scope == ":env:" else files)[option] = " ".join(shlex.split(value))
    return {**files, **env}


def uv_args(settings: dict[str, str]) -> list[str]:
    """uv's flags for pip's settings, ``--index-strategy unsafe-best-match`` first."""
    args = ["--index-strategy", "unsafe-best-match"]
    for option, flag in FLAGS.items():
        for value in settings.get(option, "").split():
            args += [flag, value]
    return args


def main() -> int:
    listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    # the Makefile splits this on whitespace, unquoted: values hold no whitespace after pip's own splitting
    print(" ".join(uv_args(pip_settings(listing))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
