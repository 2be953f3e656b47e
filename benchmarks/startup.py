"""Start-up cost of every kind of cosmos-pl command, in CPU seconds, against ``python -c "import torch"``.

Each case runs as its own process, ``--repeat`` times (median; CPU = user + system of that process, from
``os.wait4``), then once more with ``PYTHONPROFILEIMPORTTIME=1`` for its heaviest top-level imports:

- ``import torch``: the yardstick every ratio is taken against, measured in the same run;
- ``fit --help``, ``fit --print_config`` and a settings error (``--clients.batch_size 0``, exit 2) on
  ``configs/digits_smoke.yaml``;
- the start of round 0: ``cosmos-pl fit`` up to the first forward pass of round 0's first client (the test-only
  ``hang`` fault stops it there; its CPU time is read from ``/proc`` once it sleeps);
- one Flower message handler: a process that imports the ClientApp and answers ``query.hello`` the way a
  SuperNode's ClientApp process does, with the node's data already in its disk cache (a first, cold answer fills
  it; the cold one is reported too).

The last line is JSON: ``import_torch_cpu_s`` and, per case, ``cpu_s``, ``ratio`` and ``heaviest`` (module,
cumulative seconds of import).

    .venv/bin/python benchmarks/startup.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "digits_smoke.yaml"
HANG_ROUND_0 = json.dumps([{"round": 0, "client": 0, "step": "local training", "kind": "hang"}])


def _cli() -> list[str]:
    script = Path(sys.executable).with_name("cosmos-pl")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "cosmos_pl.cli"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COSMOS_PL_TEST_FAULTS", "PYTHONPROFILEIMPORTTIME")}
    env.update({"WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1", "COLUMNS": "120"}, **extra)
    return env


def _cpu_of(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    """CPU seconds (user + system) of one process run to its end, and its stderr."""
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=ROOT)
        _, _, usage = os.wait4(proc.pid, 0)
        proc.returncode = 0
        err.seek(0)
        return usage.ru_utime + usage.ru_stime, err.read().decode(errors="replace")


def _cpu_until_hang(argv: list[str], env: dict[str, str], run_dir: Path) -> tuple[float, str]:
    """CPU seconds of a run once it sleeps in the ``hang`` fault (its CPU time has stopped growing), then kill it."""
    ticks = os.sysconf("SC_CLK_TCK")
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=ROOT)
        last, still, start = -1.0, 0, time.monotonic()
        try:
            while True:
                time.sleep(0.25)
                if proc.poll() is not None:
                    err.seek(0)
                    raise RuntimeError(f"the run ended (exit {proc.returncode}) before round 0: "
                                       f"{err.read().decode(errors='replace')[-2000:]}")
                fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
                cpu = (int(fields[11]) + int(fields[12])) / ticks  # utime, stime (all threads)
                still = still + 1 if cpu == last and (run_dir / "partition.json").is_file() else 0
                last = cpu
                if still >= 6:  # 1.5 s without CPU: asleep in round 0's first forward pass
                    break
                if time.monotonic() - start > 900:
                    raise RuntimeError("round 0 did not start within 900 s")
        finally:
            proc.kill()
            proc.wait()
        err.seek(0)
        return last, err.read().decode(errors="replace")


def _heaviest(importtime: str, n: int = 5) -> list[list]:
    """The ``n`` top-level imports with the largest cumulative time, from ``-X importtime`` output."""
    top = []
    for line in importtime.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = line.split("|")
        if name.startswith("  "):  # nested imports are indented; depth 0 has one space after the bar
            continue
        top.append((int(cumulative) / 1e6, name.strip()))
    return [[name, round(sec, 3)] for sec, name in sorted(top, reverse=True)[:n]]


def _handler(state_dir: str, config_file: str) -> None:
    """One ClientApp process answering query.hello for client 0, as a SuperNode starts it per message."""
    from flwr.app import ConfigRecord, Context, RecordDict

    from cosmos_pl.flower import client_app  # noqa: F401  (what the SuperNode imports: the app and its handlers)
    from cosmos_pl.flower import node, node_data

    config_yaml = Path(config_file).read_text()
    context = Context(run_id=1, node_id=1, node_config={"partition-id": 0, "threads": 1}, state=RecordDict(),
                      run_config={"node-state-dir": state_dir})
    fingerprint = (Path(state_dir) / "fingerprint").read_text() if (Path(state_dir) / "fingerprint").is_file() \
        else None
    if fingerprint is None:
        fingerprint = node_data.load_run(config_yaml, 0, Path(state_dir) / "data").fingerprint
        (Path(state_dir) / "fingerprint").write_text(fingerprint)
    node.hello(RecordDict({"config": ConfigRecord({"config_yaml": config_yaml, "public_fingerprint": fingerprint,
                                                   "run_token": "startup"})}), context)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3, help="runs per case (median)")
    p.add_argument("--_handler", nargs=2, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a._handler:
        return _handler(*a._handler)
    work = Path(tempfile.mkdtemp(prefix="cosmos-startup-"))
    try:
        from cosmos_pl.parsers import build_fit_parser

        parser = build_fit_parser()
        config_file = work / "run.yaml"
        config_file.write_text(parser.dump(parser.parse_args(["--config", str(CONFIG)]), skip_unset=False))
        cli, py = _cli(), sys.executable
        run_dir = work / "run"
        cases = {
            "import torch": ([py, "-c", "import torch"], {}),
            "fit --help": ([*cli, "fit", "--help"], {}),
            "fit --print_config": ([*cli, "fit", "--config", str(CONFIG), "--print_config"], {}),
            "settings error": ([*cli, "fit", "--config", str(CONFIG), "--clients.batch_size", "0"], {}),
            "start of round 0": ([*cli, "fit", "--config", str(CONFIG), "--run_dir", str(run_dir), "--overwrite",
                                  "true", "--executor.threads_per_worker", "1"],
                                 {"COSMOS_PL_TEST_FAULTS": HANG_ROUND_0}),
            "flower handler (cold cache)": ([py, __file__, "--_handler", str(work / "node"), str(config_file)], {}),
            "flower handler": ([py, __file__, "--_handler", str(work / "node"), str(config_file)], {}),
        }
        results = {}
        for name, (argv, extra) in cases.items():
            runs = []
            repeat = 1 if name.endswith("(cold cache)") else a.repeat
            for _ in range(repeat):
                if name == "start of round 0":
                    cpu, err = _cpu_until_hang(argv, _env(**extra), run_dir)
                else:
                    cpu, err = _cpu_of(argv, _env(**extra))
                runs.append(cpu)
            if name == "start of round 0":
                _, trace = _cpu_until_hang(argv, _env(PYTHONPROFILEIMPORTTIME="1", **extra), run_dir)
            elif name.endswith("(cold cache)"):  # cold again for its imports (this run fills the cache once more)
                shutil.rmtree(work / "node" / "data", ignore_errors=True)
                _, trace = _cpu_of(argv, _env(PYTHONPROFILEIMPORTTIME="1", **extra))
            else:
                _, trace = _cpu_of(argv, _env(PYTHONPROFILEIMPORTTIME="1", **extra))
            results[name] = {"cpu_s": round(statistics.median(runs), 3), "runs": [round(r, 3) for r in runs],
                             "heaviest": _heaviest(trace)}
        torch_s = results["import torch"]["cpu_s"]
        for name, r in results.items():
            r["ratio"] = round(r["cpu_s"] / torch_s, 2)
            heavy = ", ".join(f"{m} {s:.2f} s" for m, s in r["heaviest"][:3])
            print(f"{name:30s} {r['cpu_s']:7.2f} s CPU  {r['ratio']:5.2f}x import torch   heaviest: {heavy}")
        print(json.dumps({"import_torch_cpu_s": torch_s, "repeat": a.repeat,
                          "cases": {k: v for k, v in results.items() if k != "import torch"}}, sort_keys=True))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
