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
        # per GPU: (memory used MiB or None, utilisation percent or None) per sample; a field nvidia-smi gives as
        # "[N/A]" (utilisation on a MIG-enabled GPU, for one) is None, the other still counts
        self.samples: dict[int, list[tuple[float | None, float | None]]] = defaultdict(list)
        self.status = "nvidia-smi absent"  # or "ran", or "failed: <its first line that is not a sample>"
        self.names: dict[int, str] = {}
        self.total: dict[int, float] = {}
        self._proc: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "GpuMonitor":
        exe = shutil.which("nvidia-smi")
        if exe is None:
            return self
        self.status = "ran"
        self._proc = subprocess.Popen([exe, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
                                       f"-lms={self.interval_ms}"], stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, text=True)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        return self

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        def number(text: str) -> float | None:
            try:
                return float(text)
            except ValueError:  # "[N/A]", "[Not Supported]"
                return None

        for line in self._proc.stdout:
            parts = [p.strip() for p in line.split(",")]
            if len(parts) != 5 or not parts[0].isdigit():
                if line.strip() and self.status == "ran":  # an error message, not a sample
                    self.status = f"failed: {line.strip()}"
                continue
            index = int(parts[0])
            self.names[index] = parts[1]
            if (total := number(parts[3])) is not None:
                self.total[index] = total
            self.samples[index].append((number(parts[2]), number(parts[4])))

    def __exit__(self, *exc) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(timeout=10)
        if self._thread is not None:
            self._thread.join(timeout=10)

    def report(self) -> list[dict]:
        """One entry per GPU seen, by index: ``index``, ``name``, ``peak_memory_mib``, ``total_memory_mib``,
        ``mean_utilisation_percent`` (None where every sample of it was "[N/A]"), ``samples``; an empty list where
        ``nvidia-smi`` is absent or failed (:attr:`status` says which)."""
        out = []
        for index in sorted(self.samples):
            used = [u for u, _ in self.samples[index] if u is not None]
            util = [p for _, p in self.samples[index] if p is not None]
            out.append({"index": index, "name": self.names[index], "peak_memory_mib": max(used, default=None),
                        "total_memory_mib": self.total.get(index),
                        "mean_utilisation_percent": round(sum(util) / len(util), 1) if util else None,
                        "samples": len(self.samples[index])})
        return out
