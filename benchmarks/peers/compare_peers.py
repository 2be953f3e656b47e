"""The same federation run by cosmos-pl, by Flower's simulation engine and by FL-bench, one after another.

    .venv/bin/python benchmarks/peers/compare_peers.py [--flbench DIR] [--repeat 1] [--rounds 10] [--threads 2]
        [--out DIR]

Exports the partition once (``cosmos-pl export-partition`` on benchmarks/peers/federation.yaml), then runs each
system's adapter in its own process with the same torch thread count (``OMP_NUM_THREADS`` and
``torch.set_num_threads``), sampling the resident memory of the adapter's whole process tree (Ray's processes
included). Per system: seconds per round (median of rounds 2..R, each from the end of the round before to the end
of its evaluation), seconds from launch to the end of round 1 (imports and start-up included), peak memory (the
largest sum over the process tree of RSS, and of PSS, which shares a library's pages among the processes that map
it), the final mean accuracy over the clients' own test sets, and the payload bytes per round. Prints a Markdown
table; the last line is JSON holding every figure and each peer's ratios against cosmos-pl's run of the same
algorithm (``round_ratio`` = cosmos-pl's seconds per round / the peer's; below 1 means cosmos-pl is faster).
With ``--repeat N`` the systems run in turn N times (A B C A B C ...: a drift of the machine's speed reaches all
alike); the table shows the median times and the range of the ratios of runs taken one after the other.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from spec import Spec, load_partition  # noqa: E402

from cosmos_pl.files import atomic_write_text  # noqa: E402

ROOT = HERE.parent.parent
SYSTEMS = ("cosmos-pl", "Flower", "FL-bench")
PEER_ALGORITHMS = {"cosmos-pl": ("fedavg", "fedmd"), "Flower": ("fedavg",), "FL-bench": ("fedavg", "fedmd")}


class TreeMemory(threading.Thread):
    """Samples ``pid`` and its descendants every ``interval`` s; ``peak_rss`` / ``peak_pss`` in bytes (sums)."""

    def __init__(self, pid: int, interval: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval, self.peak_rss, self.peak_pss = pid, interval, 0, 0
        self.done = threading.Event()

    def run(self) -> None:
        import psutil

        try:
            root = psutil.Process(self.pid)
        except psutil.NoSuchProcess:
            return
        while not self.done.is_set():
            rss = pss = 0
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                break
            for p in procs:
                try:
                    info = p.memory_full_info()
                    rss, pss = rss + info.rss, pss + getattr(info, "pss", info.rss)
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue
            self.peak_rss, self.peak_pss = max(self.peak_rss, rss), max(self.peak_pss, pss)
            self.done.wait(self.interval)


def adapter_command(system: str, algorithm: str, spec: Spec, partition: Path, out: Path, record: Path,
                    flbench: Path | None) -> list[str]:
    """The command line that runs ``system``'s adapter for ``algorithm``."""
    py = sys.executable
    if system == "cosmos-pl":
        return [py, str(HERE / "cosmos_adapter.py"), "--spec", spec.to_json(), "--algorithm", algorithm,
                "--run_dir", str(out / f"cosmos-pl-{algorithm}-run"), "--out", str(record)]
    if system == "Flower":
        return [py, str(HERE / "flower_adapter.py"), "--partition", str(partition), "--spec", spec.to_json(),
                "--out", str(record)]
    return [py, str(HERE / "flbench_adapter.py"), "--flbench", str(flbench), "--partition", str(partition),
            "--spec", spec.to_json(), "--algorithm", algorithm, "--out", str(record)]


def run_one(system: str, algorithm: str, spec: Spec, partition: Path, out: Path, flbench: Path | None,
            tag: str = "") -> dict:
    """Run one adapter; returns its figures (or ``error`` with the log's path). ``tag`` ends the file names."""
    record = out / f"{system}-{algorithm}{tag}.json"
    log = out / f"{system}-{algorithm}{tag}.log"
    record.unlink(missing_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(spec.threads), "MKL_NUM_THREADS": str(spec.threads),
           "PYTHONHASHSEED": "0", "COLUMNS": "120", "WANDB_MODE": "disabled", "RAY_DEDUP_LOGS": "0"}
    cmd = adapter_command(system, algorithm, spec, partition, out, record, flbench)
    with open(log, "w") as f:
        launch = time.time()
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        memory = TreeMemory(proc.pid)
        memory.start()
        code = proc.wait()
        wall = time.time() - launch
        memory.done.set()
        memory.join()
    figures = {"system": system, "algorithm": algorithm, "exit": code, "wall_s": round(wall, 2),
               "peak_rss_mib": round(memory.peak_rss / 2**20, 1), "peak_pss_mib": round(memory.peak_pss / 2**20, 1),
               "log": str(log)}
    if code != 0 or not record.is_file():
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["(empty log)"]
        return {**figures, "error": f"exit {code}: {tail[0][:300]}"}
    rec = json.loads(record.read_text())
    ends = rec["round_end_unix"]
    steps = [b - a for a, b in zip(ends, ends[1:])]
    return {**figures, "first_round_s": round(ends[0] - launch, 2),
            "round_s": round(statistics.median(steps), 3) if steps else None,
            "accuracy": round(rec["accuracy"], 4), "client_accuracy": rec["client_accuracy"],
            "bytes_per_round": rec["bytes_per_round"], "payload_bytes_per_round": rec["payload_bytes_per_round"],
            "versions": rec.get("versions"),
            **{k: rec[k] for k in ("notes", "flbench_commit") if k in rec}}


def combine(runs: list[dict]) -> dict:
    """One row from the repeats of one system and algorithm: the median of the times, the largest memory, the
    figures of the first run otherwise; with several runs the per-run times too (``round_s_runs``, ...). An
    accuracy that differs between repeats (a system that does not repeat exactly) is kept per run."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[0]
    row = dict(ok[0])
    if len(runs) > 1:
        for key in ("round_s", "first_round_s", "wall_s"):
            row[f"{key}_runs"] = [r[key] for r in ok]
            row[key] = round(statistics.median(row[f"{key}_runs"]), 3)
        for key in ("peak_rss_mib", "peak_pss_mib"):
            row[key] = max(r[key] for r in ok)
        row["failed_runs"] = len(runs) - len(ok)
        if len({r["accuracy"] for r in ok}) > 1:
            row["accuracy_runs"] = [r["accuracy"] for r in ok]
    return row


def ratios(rows: list[dict]) -> dict:
    """``{"<peer> <algorithm>": {...}}``: cosmos-pl's figure / the peer's, for round time, first round and memory;
    with repeats (rows from :func:`combine`) also each run's round-time ratio against the cosmos-pl run beside it
    (``round_ratio_runs``: run k of both, which ran one after the other)."""
    ours = {r["algorithm"]: r for r in rows if r["system"] == "cosmos-pl" and "error" not in r}
    out = {}
    for r in rows:
        base = ours.get(r["algorithm"])
        if r["system"] == "cosmos-pl" or base is None or "error" in r:
            continue
        out[f"{r['system']} {r['algorithm']}"] = ratio = {
            "round_ratio": round(base["round_s"] / r["round_s"], 3),
            "first_round_ratio": round(base["first_round_s"] / r["first_round_s"], 3),
            "peak_pss_ratio": round(base["peak_pss_mib"] / r["peak_pss_mib"], 3),
            "accuracy_diff": round(base["accuracy"] - r["accuracy"], 4)}
        if "round_s_runs" in r and "round_s_runs" in base and len(r["round_s_runs"]) == len(base["round_s_runs"]):
            ratio["round_ratio_runs"] = [round(b / p, 3) for b, p in zip(base["round_s_runs"], r["round_s_runs"])]
    return out


def table(rows: list[dict]) -> str:
    """The Markdown table README shows; the round ratio is cosmos-pl's seconds per round over the row's (with
    repeats: the ratio of the medians, then the range of the per-run ratios)."""
    ratio = ratios(rows)
    head = ("| system | algorithm | s / round (median, rounds 2..R) | cosmos-pl's s / round over this one's | "
            "s to end of round 1 | peak RSS MiB | peak PSS MiB | final mean accuracy | payload MB / round | "
            "all MB / round |")
    lines = [head, "|" + " --- |" * 10]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['system']} | {r['algorithm']} | not run: {r['error']} | | | | | | | |")
            continue
        rr = ratio.get(f"{r['system']} {r['algorithm']}")
        runs = rr.get("round_ratio_runs") if rr else None
        cell = ("1" if r["system"] == "cosmos-pl" else "-") if rr is None else f"{rr['round_ratio']:.2f}" + (
            f" ({min(runs):.2f}-{max(runs):.2f})" if runs else "")
        lines.append(f"| {r['system']} | {r['algorithm']} | {r['round_s']:.2f} | {cell} | {r['first_round_s']:.1f} | "
                     f"{r['peak_rss_mib']:.0f} | {r['peak_pss_mib']:.0f} | {r['accuracy']:.4f} | "
                     f"{r['payload_bytes_per_round'] / 1e6:.2f} | {r['bytes_per_round'] / 1e6:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--flbench", type=Path, help="an FL-bench checkout (git clone of KarhouTam/FL-bench); "
                    "without it FL-bench is left out")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated subset of {SYSTEMS}")
    ap.add_argument("--algorithms", default="fedavg,fedmd", help="comma-separated: fedavg, fedmd")
    for field, value in Spec().__dict__.items():
        ap.add_argument(f"--{field}", type=type(value), default=value)
    ap.add_argument("--partition_seed", type=int, help="the partition's seed (default: --seed); a different value "
                    "keeps one partition while --seed changes the peers' training seed (initialization, shuffling), "
                    "which measures a system's run-to-run spread; cosmos-pl draws both from one seed, so it is "
                    "left out")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each system, taken in turn (A B C A B C ...); "
                    "the table shows the median time and each peer's ratio against the cosmos-pl run beside it")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/peers/out"), help="records and logs (a folder)")
    a = ap.parse_args(argv)
    spec = Spec(**{k: getattr(a, k) for k in Spec().__dict__})
    partition_seed = spec.seed if a.partition_seed is None else a.partition_seed
    if a.repeat < 1:
        ap.error(f"--repeat={a.repeat}: give 1 or more")
    systems = [s for s in SYSTEMS if s in a.systems.split(",")]
    unknown = set(a.systems.split(",")) - set(SYSTEMS)
    if unknown:
        ap.error(f"--systems={a.systems!r}: {sorted(unknown)} unknown; choose from {','.join(SYSTEMS)}")
    if "FL-bench" in systems and a.flbench is None:
        print("FL-bench left out: give --flbench DIR (a checkout of KarhouTam/FL-bench)")
        systems.remove("FL-bench")
    if partition_seed != spec.seed and "cosmos-pl" in systems:
        print(f"cosmos-pl left out: --partition_seed {partition_seed} differs from --seed {spec.seed}")
        systems.remove("cosmos-pl")
    if a.flbench is not None and not (a.flbench / "main.py").is_file():
        ap.error(f"--flbench={a.flbench}: no main.py there; give the folder of a FL-bench checkout")
    a.out.mkdir(parents=True, exist_ok=True)
    partition = a.out / f"partition-seed{partition_seed}"
    if not (partition / "public.npz").is_file():
        from cosmos_adapter import export_args

        export = export_args(replace(spec, seed=partition_seed), partition)
        subprocess.run([sys.executable, "-m", "cosmos_pl.cli", *export], check=True, cwd=ROOT)
    clients, public, classes = load_partition(partition)
    print(f"partition {partition}: {len(clients)} clients, {sum(len(c.y_train) for c in clients)} training and "
          f"{sum(len(c.y_test) for c in clients)} test images, |U| = {len(public)}, {len(classes)} classes; {spec}")
    rows = []
    for algorithm in a.algorithms.split(","):
        runs: dict[str, list[dict]] = {s: [] for s in systems if algorithm in PEER_ALGORITHMS[s]}
        for k in range(a.repeat):  # the systems in turn, so that a drift of the machine's speed reaches all alike
            for system in runs:
                print(f"running {system} {algorithm}" + (f" ({k + 1} of {a.repeat})" if a.repeat > 1 else "") + " ...",
                      flush=True)
                row = run_one(system, algorithm, spec, partition, a.out, a.flbench, f"-{k + 1}" if a.repeat > 1 else "")
                print("  " + (row.get("error") or f"{row['round_s']:.2f} s/round, first round at "
                              f"{row['first_round_s']:.1f} s, accuracy {row['accuracy']:.4f}, peak PSS "
                              f"{row['peak_pss_mib']:.0f} MiB"), flush=True)
                runs[system].append(row)
        rows += [combine(r) for r in runs.values()]
    print(table(rows))
    result = {"spec": json.loads(spec.to_json()), "partition_seed": partition_seed, "repeat": a.repeat, "rows": rows,
              "ratios": ratios(rows)}
    atomic_write_text(a.out / "peers.json", json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
