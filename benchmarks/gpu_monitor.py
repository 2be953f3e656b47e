"""Per-GPU peak memory and mean utilisation over a block of code, from ``nvidia-smi``, for every process on the GPU.

torch's own ``max_memory_allocated`` sees only the calling process (the parallel executor's workers hold their own
models) and opens a CUDA context on each device it is asked about; ``nvidia-smi`` sees the whole device and opens
none. Without ``nvidia-smi`` (a CPU machine) the monitor reports no GPUs.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections import defaultdict

QUERY = "index,name,memory.used,memory.total,utilization.gpu"


class GpuMonitor:
    """Samples every GPU every ``interval_ms`` while inside ``with``; :meth:`report` then gives, per GPU, its name,
    peak memory used (MiB, all processes; a peak shorter than one interval can be missed), total memory (MiB), mean
    utilisation (percent of the samples' time a kernel ran, as ``nvidia-smi`` defines it) and the sample count."""

    def __init__(self, interval_ms: int = 500) -> None:
        self.interval_ms = interval_ms
        self.samples: dict[int, list[tuple[float, float]]] = defaultdict(list)
        self.names: dict[int, str] = {}
        self.total: dict[int, float] = {}
        self._proc: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "GpuMonitor":
        exe = shutil.which("nvidia-smi")
        if exe is None:
            return self
        self._proc = subprocess.Popen([exe, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
                                       f"-lms={self.interval_ms}"], stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, text=True)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        return self

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            parts = [p.strip() for p in line.split(",")]
            if len(parts) != 5:
                continue
            try:
                index, used, total, util = int(parts[0]), float(parts[2]), float(parts[3]), float(parts[4])
            except ValueError:  # "[N/A]" on GPUs that do not report a field
                continue
            self.names[index], self.total[index] = parts[1], total
            self.samples[index].append((used, util))

    def __exit__(self, *exc) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(timeout=10)
        if self._thread is not None:
            self._thread.join(timeout=10)

    def report(self) -> list[dict]:
        """One entry per GPU seen, by index: ``index``, ``name``, ``peak_memory_mib``, ``total_memory_mib``,
        ``mean_utilisation_percent``, ``samples``; an empty list where ``nvidia-smi`` is absent."""
        out = []
        for index in sorted(self.samples):
            rows = self.samples[index]
            out.append({"index": index, "name": self.names[index], "peak_memory_mib": max(u for u, _ in rows),
                        "total_memory_mib": self.total[index],
                        "mean_utilisation_percent": round(sum(p for _, p in rows) / len(rows), 1),
                        "samples": len(rows)})
        return out
