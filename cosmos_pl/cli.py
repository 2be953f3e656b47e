"""The ``cosmos-pl`` command line, built with jsonargparse.

``cosmos-pl fit --config FILE [--dotted.overrides]`` trains one algorithm (COSMOS by default) and writes a run
directory; ``cosmos-pl compare --config FILE --algorithms cosmos,fedmd --seeds 0,1,2 --out DIR`` runs every
(algorithm, seed) pair and writes the comparison. ``--print_config`` prints the fully resolved config; ``--help``
documents every option (from the docstrings in :mod:`cosmos_pl.config` and the algorithm classes).

``cosmos-pl fit --resume RUN_DIR`` continues a run from its last complete round checkpoint with that run's own
config, exactly as if it had never stopped (a flag that changes the config is an error naming the keys).

This module assembles the subcommands and turns what they raise into exit statuses: their settings are
:mod:`cosmos_pl.parsers`, ``fit`` is :mod:`cosmos_pl.fit`, ``compare`` :mod:`cosmos_pl.compare`, ``export-partition``
:mod:`cosmos_pl.export_partition`, ``flower-run`` and ``flower-keys`` :mod:`cosmos_pl.flower.run` and
:mod:`cosmos_pl.flower.keys`.

Exit status: 0 on success; 2 for a user error (a bad setting, missing data, a run directory in use, W&B that
cannot start, a run stopped by failing clients), printed as one line ``cosmos-pl: error: ...``; 1 for an
internal fault (a traceback and where to report it) or a failed compare pair; 143 on SIGTERM and 130 on SIGINT
(Ctrl-C), after one line saying how to resume.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import traceback
from typing import Any

from cosmos_pl import signals
from cosmos_pl.class_groups import class_args
from cosmos_pl.docstrings import ArgumentParser  # --help prints the docstrings' roles as plain text
from cosmos_pl.errors import UserError
from cosmos_pl.export_partition import run_export
from cosmos_pl.fit import resume_config, resume_line, run_fit
from cosmos_pl.limits import open_file_limit_line, raise_open_file_limit, too_many_open_files
from cosmos_pl.parsers import algorithm_help, build_compare_parser, build_export_parser, build_fit_parser
from cosmos_pl.signals import Interrupted

ISSUES_URL = "https://github.com/cosmos-pl/cosmos-pl/issues"

__all__ = ["build_parser", "main", "run"]

_FLOWER_RUN = ("Submit a Flower run with flwr run's arguments ([APP] [SUPERLINK] --run-config ... --stream), wait for "
               "it, and exit 0 only when it completed (2 when it failed, was stopped or could not start).")


@functools.lru_cache(maxsize=1)
def build_parser() -> ArgumentParser:
    """The ``cosmos-pl`` parser with its subcommands; built once per process (parsing does not change it)."""
    parser = ArgumentParser(prog="cosmos-pl", description="cosmos-pl: model-agnostic personalized federated learning.",
                            exit_on_error=False, allow_abbrev=False)
    parser.add_argument("--version", action="version", version=_version(), help="Print the version and exit.")
    sub = parser.add_subcommands(required=True)
    sub.add_subcommand("fit", build_fit_parser(), help="Train one algorithm and write a run directory.")
    sub.add_subcommand("compare", build_compare_parser(), help="Compare algorithms over seeds and write a report.")
    sub.add_subcommand("export-partition", build_export_parser(),
                       help="Write each simulated client's data (and U) as one folder per site, for a deployment.")
    # listed for --help only: main() hands their arguments to cosmos_pl.flower.run / .keys before any parsing
    sub.add_subcommand("flower-run", ArgumentParser(description=_FLOWER_RUN),
                       help="flwr run that waits for the run and exits 2 unless it completed (flwr run's arguments).")
    sub.add_subcommand("flower-keys", ArgumentParser(description="Make a deployment's TLS certificates and "
                                                                 "SuperNode keys (--out DIR --host A --nodes N)."),
                       help="The certificates and SuperNode keys of a TLS deployment with node authentication.")
    return parser


def _version() -> str:
    """``cosmos-pl X.Y.Z (torch A, lightning B, Python C)``: what a bug report needs."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    from cosmos_pl import __version__

    def of(package: str) -> str:
        try:
            return version(package)
        except PackageNotFoundError:
            return "not installed"

    return (f"cosmos-pl {__version__} (torch {of('torch')}, lightning {of('lightning')}, flwr {of('flwr')}, "
            f"Python {platform.python_version()})")


def run(argv: list[str]) -> Any:
    """Parse ``argv`` (e.g. ``["fit", "--config", ...]``) and run it; returns ``fit``'s summary dict or
    ``compare``'s results (None once ``--algorithm.help NAME`` has printed its help:
    :func:`~cosmos_pl.parsers.algorithm_help`)."""
    parser = build_parser()
    if argv and argv[0] in ("fit", "compare", "export-partition"):
        text = algorithm_help(argv[1:], f"cosmos-pl {argv[0]}")  # by short name too, as --algorithm takes it
        if text is not None:
            print(text, end="")
            return None
        # a class chosen starts from its own defaults
        argv = [argv[0], *class_args(parser._subcommands_action._name_parser_map[argv[0]], argv[1:])]
    cfg = parser.parse_args(argv)
    sub = parser._subcommands_action._name_parser_map[cfg.subcommand]
    if cfg.subcommand == "fit":
        fit = resume_config(cfg.fit, sub) if cfg.fit.resume else cfg.fit
        return run_fit(fit, sub)
    if cfg.subcommand == "export-partition":
        return run_export(cfg["export-partition"])
    from cosmos_pl.compare import run_compare

    return run_compare(cfg.compare, sub, build_fit_parser())


def _interrupted(err: Interrupted, command: str) -> int:
    name = signal.Signals(err.signum).name
    if command == " compare":
        line = f"stopped by {name}; run the same command again to resume (finished pairs are kept, the others " \
               "resume from their last complete round)"
    elif err.run_dir is not None and err.last_round is not None:
        line = f"stopped by {name}; {resume_line(err.run_dir, err.last_round)}"
    elif err.run_dir is not None:
        line = f"stopped by {name} before round 0 ended; nothing to resume: start the run again"
    else:
        line = f"stopped by {name}"
    print(f"cosmos-pl: {line}", file=sys.stderr, flush=True)
    return 128 + err.signum


def _error(message: str) -> int:
    print(f"cosmos-pl: error: {' '.join(str(message).split())}", file=sys.stderr)  # one line
    return 2


def main(argv: list[str] | None = None) -> int:
    """The ``cosmos-pl`` console script.

    Returns the exit status: 0 on success; 2 for a user error (:class:`~cosmos_pl.errors.UserError`, a parse
    error, a missing file), printed as one line on stderr; 1 for an internal fault (any other exception: its
    traceback and where to report it) or when a compare pair failed; 143 on SIGTERM and 130 on SIGINT (Ctrl-C),
    after one line saying how to resume.
    """
    from jsonargparse import ArgumentError

    os.environ.setdefault("PYTHONHASHSEED", "0")
    raise_open_file_limit()  # a desktop's 1,024 is a soft limit: up to the hard one, for this process and its workers
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "flower-run":  # flwr run's own arguments, passed on as they are
        from cosmos_pl.flower.run import main as flower_run

        return flower_run(args[1:], prog="cosmos-pl flower-run")
    if args and args[0] == "flower-keys":
        from cosmos_pl.flower.keys import main as flower_keys

        return flower_keys(args[1:])
    command = f" {args[0]}" if args and args[0] in ("fit", "compare", "export-partition") else ""
    # a scheduler's time limit or Ctrl-C: unwind, keep the last complete round, say how to resume, exit 143/130;
    # cosmos_pl.signals records the stop too, so one whose exception was lost still ends here
    previous = signals.install()
    try:
        with signals.converted():
            result = run(args)
            signals.check()
        if argv is None:  # the console script: the results are written, a late SIGTERM must not turn exit 0 into 143
            for s in previous:
                signal.signal(s, signal.SIG_IGN)
            previous = {}
    except Interrupted as err:
        return _interrupted(err, command)
    except ArgumentError as err:  # a parse error: unknown key, wrong type, missing config file
        return _error(f"{err} (options: cosmos-pl{command} --help)")
    except (UserError, FileNotFoundError) as err:  # FileNotFoundError: a config or data file named in the settings
        return _error(str(err))
    except KeyboardInterrupt:
        print("cosmos-pl: interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        if too_many_open_files(err):  # a limit of the session, not a bug: one line with the fix
            return _error(open_file_limit_line())
        traceback.print_exc()
        print(f"cosmos-pl: internal error (a bug in cosmos-pl): please report it with the command, config.yaml and "
              f"this traceback at {ISSUES_URL}", file=sys.stderr)
        return 1
    finally:
        signals.restore(previous)
    return 1 if getattr(result, "failed", False) else 0


if __name__ == "__main__":
    sys.exit(main())
