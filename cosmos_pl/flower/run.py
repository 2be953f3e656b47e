"""``flwr run`` that waits for the run and exits non-zero unless it completed.

Flower's ``flwr run`` returns as soon as the SuperLink has accepted the run (with ``--stream``, once the logs end),
with exit status 0 even when the ServerApp then failed: no SuperNode joined, a node refused its ``partition-id``, a bad
setting. This command takes ``flwr run``'s arguments, submits the run the same way, waits for it to end (showing its
logs with ``--stream``) and reads its final status from the SuperLink::

    cosmos-pl flower-run . local-deployment --stream --run-config "config='configs/digits_flower.yaml'"

Exit status: 0 when the run's status is ``finished:completed``; 2 when it ended otherwise (``finished:failed``,
``finished:stopped``) or could not be started (no SuperLink at that address, an unknown run config key), after one
line on stderr: ``cosmos-pl: error: the Flower run <id> ended finished:failed; <Flower's status details, which
carry the ServerApp's error>; ...``; 130 on Ctrl-C (the run goes on on the SuperLink: ``flwr stop <id>`` stops
it). It drives Flower's own CLI (``flwr run --format json`` for the run id, ``flwr log <id> --stream`` to wait,
``flwr ls --run-id <id> --format json`` for the status), run with this Python, so it reads the same
``FLWR_HOME`` connections as ``flwr``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any, Optional, Sequence

__all__ = ["main", "COMPLETED"]

COMPLETED = "finished:completed"  # Flower's run status (``flwr ls``) of a run whose ServerApp returned
_FLWR = [sys.executable, "-m", "flwr.cli.app"]


def _parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="flwr run, then wait for the run; exit status 0 only when it "
                                "completed (2 when it failed, was stopped or could not start)")
    p.add_argument("app", nargs="?", default=".", help="the Flower app: a path (default: .) or @account/app")
    p.add_argument("superlink", nargs="?", default=None,
                   help="a SuperLink connection named in $FLWR_HOME/config.toml (default: its default)")
    p.add_argument("--run-config", "-c", action="append", default=[], help="as flwr run's; may repeat")
    p.add_argument("--federation-config", action="append", default=[], help="as flwr run's; may repeat")
    p.add_argument("--federation", default=None, help="as flwr run's")
    p.add_argument("--stream", action="store_true", help="show the run's logs while it runs")
    return p


def _flwr_json(args: list[str]) -> dict[str, Any]:
    """Run ``flwr <args> --format json``; its JSON reply (``{"success": false, "error-message": ...}`` when the
    command failed, or its output could not be read)."""
    proc = subprocess.run([*_FLWR, *args, "--format", "json"], capture_output=True, text=True)
    out = proc.stdout
    try:
        return json.JSONDecoder().raw_decode(out[out.index("{"):])[0]
    except ValueError:
        tail = " ".join((out + proc.stderr).split())[-500:]
        return {"success": False, "error-message": f"flwr {args[0]} exited {proc.returncode}: {tail}"}


def _reason(reply: dict[str, Any]) -> str:
    """The last line of a failed reply's message (the lines before it are the command's own chatter)."""
    lines = [line.strip() for line in str(reply.get("error-message", "")).splitlines() if line.strip()]
    return lines[-1] if lines else "no reason given"


def _error(line: str) -> int:
    print(f"cosmos-pl: error: {' '.join(line.split())}", file=sys.stderr, flush=True)
    return 2


def main(argv: Optional[Sequence[str]] = None, prog: str = "cosmos-pl flower-run") -> int:
    """Submit a Flower run as ``flwr run`` would, wait for it to end and return the exit status (module docstring):
    0 when it completed, 2 when it failed, was stopped or could not be started, 130 on Ctrl-C.

    ``argv``: ``flwr run``'s arguments (``[APP] [SUPERLINK] [--run-config ...] [--federation-config ...]
    [--federation ...] [--stream]``; not ``--format``); default ``sys.argv[1:]``.
    """
    from cosmos_pl.flower import require_flwr

    try:
        args = _parser(prog).parse_args(argv)
    except SystemExit as stop:  # --help (0) or a usage error (2), already printed by argparse
        return int(stop.code or 0)
    try:
        require_flwr()
    except ImportError as err:
        return _error(str(err))
    link = [args.superlink] if args.superlink else []
    options = [f"--run-config={v}" for v in args.run_config]
    options += [f"--federation-config={v}" for v in args.federation_config]
    options += [f"--federation={args.federation}"] if args.federation else []
    started = _flwr_json(["run", args.app, *link, *options])
    if not started.get("success") or not started.get("run-id"):
        return _error(f"flwr run could not start the run: {_reason(started)}")
    run_id = str(started["run-id"])
    where = " ".join([run_id, *link])
    print(f"cosmos-pl: started Flower run {run_id}; waiting for it to end", flush=True)
    shown = None if args.stream else subprocess.DEVNULL
    try:
        while True:
            # the SuperLink ends a log stream once the run has finished: the wait needs no polling
            subprocess.run([*_FLWR, "log", run_id, *link, "--stream"], stdout=shown, stderr=shown)
            listed = _flwr_json(["ls", *link, "--run-id", run_id])
            if not listed.get("success") or not listed.get("runs"):
                return _error(f"the status of the Flower run {run_id} cannot be read: {_reason(listed)} "
                              f"(flwr ls --run-id {where})")
            run = listed["runs"][0]
            status = str(run.get("status", ""))
            if status.startswith("finished"):
                break
            # the stream broke off before the run finished (a restarted SuperLink): wait on, without showing the
            # logs again from their start
            shown = subprocess.DEVNULL
            time.sleep(2.0)
    except KeyboardInterrupt:
        print(f"cosmos-pl: interrupted; the Flower run {run_id} goes on on the SuperLink (flwr stop {where} stops "
              "it)", file=sys.stderr, flush=True)
        return 130
    if status == COMPLETED:
        print(f"cosmos-pl: the Flower run {run_id} ended {status}", flush=True)
        return 0
    details = str(run.get("status-details", "")).strip() or "no details"
    return _error(f"the Flower run {run_id} ended {status}; {details} (its log: flwr log {where})")


if __name__ == "__main__":
    sys.exit(main())
