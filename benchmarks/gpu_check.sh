#!/usr/bin/env bash
# For a person with NVIDIA GPUs, from a fresh clone: the `cuda` tests (tests/test_cuda.py), then one round of the
# paper's setup (configs/cifar100.yaml: 25 clients, MobileNetV2 + SqueezeNet clients, 5 VGG16 teachers, bf16-mixed)
# on CIFAR-100, or a same-shape stand-in with the same 5 class groups where it cannot be downloaded. The last line
# is JSON: seconds per round and per stage, images per second per stage, peak memory and mean utilisation per GPU.
#   benchmarks/gpu_check.sh [--dry-run] [--data-dir DIR] [--run-dir DIR] [cosmos-pl overrides ...]
#   e.g. benchmarks/gpu_check.sh --executor.workers_per_device 2
# --dry-run: tiny sizes that finish on a CPU (the script's logic only; tests/test_gpu_check.py runs it). Without it,
# no usable CUDA stops everything at the first step (exit status 2, one line saying why and how to fix it).
# The environment: `make` builds .venv with the test extras (as `make test` does) unless PY names a Python that has
# cosmos-pl and pytest already. Paths are taken from where it is run; the settings are checked before anything runs.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
if [ -z "${PY:-}" ]; then
  make -C "$ROOT" .venv/.installed-test
  PY="$ROOT/.venv/bin/python"
elif [[ "$PY" == */* ]]; then
  PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"
fi
# first: the settings, and CUDA (unless --dry-run), so that the cuda tests below never "pass" by skipping every test
"$PY" "$ROOT/benchmarks/gpu_check.py" --check "$@"
# `-p no:cacheprovider`: nothing written into the clone; in a --dry-run without CUDA every test here is skipped
(cd "$ROOT" && "$PY" -m pytest -q -p no:cacheprovider -m cuda tests/test_cuda.py)
exec "$PY" "$ROOT/benchmarks/gpu_check.py" "$@"
