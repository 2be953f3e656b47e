#!/usr/bin/env bash
# For a person with NVIDIA GPUs, from a fresh clone, or on a GPU machine without network (--offline). Its steps:
#  1. the machine: `ulimit -n`, each GPU's name, driver, compute capability and compute mode (nvidia-smi), the GPU
#     count (where there is one GPU, a line saying the two-GPU paths were not tested);
#  2. with --offline, the Python packages' versions and `cosmos-pl fit --help` parsed (benchmarks/gpu_offline.py
#     check); the settings, and CUDA (unless --dry-run): without usable CUDA, or a package, it stops here, exit
#     status 2 and one line saying why and how to fix it, so that the cuda tests never "pass" by skipping them all;
#  3. the `cuda` tests (tests/test_cuda.py) but their sequential-against-parallel test, which step 4 covers;
#  4. four small digits runs at once (gpu_check.py --equality): sequential against parallel (two workers per GPU,
#     under `ulimit -n 1024`), under the default flags and under trainer.deterministic true: each pair's records
#     equal, or their first difference;
#  5. one round of the paper's setup (configs/cifar100.yaml: 25 clients, MobileNetV2 + SqueezeNet clients, 5 VGG16
#     teachers, bf16-mixed) on CIFAR-100, or a same-shape stand-in with the same 5 class groups where it is not to
#     be had. Its last line, the script's last on stdout, is JSON: seconds per round and per stage, images per
#     second per stage, peak memory and mean utilisation per GPU.
# Each step's start and its wall time go to stderr ("== NAME: passed, 12.3 s"); a failed step does not stop the
# next ones (but step 2 does). Exit status: 0 every step passed, 1 one failed (the last line names them), 2 step 2.
#   benchmarks/gpu_check.sh [--dry-run] [--offline] [--budget S] [--data-dir DIR] [--run-dir DIR] [overrides ...]
#   e.g. benchmarks/gpu_check.sh --executor.workers_per_device 2   (cosmos-pl overrides: the paper round only)
# --dry-run: tiny sizes that finish on a CPU (the script's logic only; tests/test_gpu_check.py runs it).
# --offline: no network and no make: the Python is PY, else `python3`, which must have torch (with CUDA),
#   torchvision, lightning, timm, torchmetrics, scikit-learn, scipy, numpy, pyyaml, matplotlib, pillow, rich, pytest
#   and filelock; the rest (jsonargparse and what it needs) comes as the wheels in benchmarks/wheels (`make
#   gpu-wheels` on a machine with network), installed into a temporary folder with pip --no-index; the repository
#   goes on PYTHONPATH; CIFAR-100 only where already in the data folder. With --dry-run it also runs as if on such a
#   machine: every package outside those and what they require is hidden from every import
#   (benchmarks/gpu_offline.py guard), so that a module needing another one fails here as it would there.
# --budget S: the whole script in S seconds: the digits runs are stopped where they would leave the paper round
#   less than 4.5 minutes, the paper round at S (then it says so, and the steps before it keep their results).
# Without --offline, `make` builds .venv with the test extras (as `make test` does) unless PY names a Python that
# has cosmos-pl and pytest already. Where OUT names a folder, all it prints also goes to $OUT/gpu_check.log.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -n "${OUT:-}" ] && [ -z "${GPU_CHECK_LOGGING:-}" ]; then
  mkdir -p "$OUT"
  GPU_CHECK_LOGGING=1 bash "${BASH_SOURCE[0]}" "$@" 2>&1 | tee "$OUT/gpu_check.log"
  exit "${PIPESTATUS[0]}"
fi
export PYTHONUNBUFFERED=1  # the Python steps' lines in order with the script's own
DRY="" OFFLINE="" BUDGET="" args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1; args+=("$1") ;;
    --offline) OFFLINE=1; args+=("$1") ;;
    -h|--help) sed -n '2,31p' "${BASH_SOURCE[0]}" | cut -c3-; exit 0 ;;  # the header above: nothing runs
    --budget) BUDGET="${2:-}"; [ -n "$BUDGET" ] || BUDGET="(no value)"; shift ;;
    --budget=*) BUDGET="${1#*=}" ;;
    *) args+=("$1") ;;
  esac
  shift
done
if [ -n "$BUDGET" ] && ! [[ "$BUDGET" =~ ^[0-9]+$ ]]; then
  echo "gpu_check: error: --budget '$BUDGET': give whole seconds, e.g. --budget 450" >&2; exit 2
fi
START=$SECONDS
left() { echo $(( BUDGET - (SECONDS - START) )); }
upto() { local l; l=$(left); echo $(( l < 1 ? 1 : (l < $1 ? l : $1) )); }  # the seconds left, at least 1, at most $1

if [ -n "$OFFLINE" ]; then
  PY="${PY:-python3}"
elif [ -z "${PY:-}" ]; then
  make -C "$ROOT" .venv/.installed-test || exit 2
  PY="$ROOT/.venv/bin/python"
fi
if [[ "$PY" == */* ]]; then PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"; fi
TEMP="$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")"
trap 'rm -rf "$TEMP"' EXIT
if [ -n "$OFFLINE" ]; then
  SITE="" GUARD=""
  shopt -s nullglob; wheels=("$ROOT"/benchmarks/wheels/*.whl); shopt -u nullglob
  if [ ${#wheels[@]} -gt 0 ]; then
    SITE="$TEMP/site"
    "$PY" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-index --no-deps \
      --no-compile --target "$SITE" "${wheels[@]}" || { echo "gpu_check: error: pip could not install benchmarks/wheels into $SITE" >&2; exit 2; }
    echo "carried wheels installed into $SITE: $(cd "$ROOT/benchmarks/wheels" && echo *.whl)"
  else
    echo "no benchmarks/wheels: this Python's own jsonargparse and co. serve (make gpu-wheels brings them)"
  fi
  if [ -n "$DRY" ]; then
    GUARD="$TEMP/guard"
    "$PY" "$ROOT/benchmarks/gpu_offline.py" guard "$GUARD" ${SITE:+--site "$SITE"} || exit 2
  fi
  export PYTHONPATH="${GUARD:+$GUARD:}${SITE:+$SITE:}$ROOT${PYTHONPATH:+:$PYTHONPATH}"
fi

# 1. the machine
echo "ulimit -n: $(ulimit -Sn) (hard limit $(ulimit -Hn))"
NGPU=0
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=index,name,driver_version,compute_cap,compute_mode,memory.total --format=csv 2>&1
  NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
else
  echo "nvidia-smi: absent"
fi
if [ "$NGPU" -ge 2 ]; then
  echo "GPUs: $NGPU: the two-GPU paths are tested (the cuda tests' pinned workers, the parallel runs over every GPU)"
else
  echo "GPUs: $NGPU: the two-GPU paths (a pinned worker per GPU, slots alternating GPUs) are NOT tested: need two"
fi
# 2. the settings, and CUDA (unless --dry-run); with --offline first the versions, and what this Python lacks
"$PY" "$ROOT/benchmarks/gpu_check.py" --check "${args[@]}" || exit $?

FAILED=()
now() { date +%s.%N; }
step() {  # step NAME COMMAND...: run it, then its wall time and whether it passed
  local name="$1" t0 rc
  shift
  t0=$(now)
  echo "== $name" >&2
  "$@"
  rc=$?
  local dt; dt=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
  if [ "$rc" -eq 0 ]; then
    echo "== $name: passed, $dt s" >&2
  else
    echo "== $name: FAILED (exit $rc), $dt s" >&2
    FAILED+=("$name")
  fi
}
# 3. `-p no:cacheprovider`: nothing written into the clone; in a --dry-run without CUDA every test here is skipped
EQUAL_TEST=tests/test_cuda.py::test_sequential_and_parallel_runs_on_the_gpu_give_identical_metrics_when_deterministic
cuda_tests() {
  (cd "$ROOT" && ${BUDGET:+timeout -k 10 $(upto 180)} "$PY" -m pytest -q \
    -p no:cacheprovider -m cuda tests/test_cuda.py --deselect "$EQUAL_TEST")
}
step "cuda tests" cuda_tests
# 4. sequential against parallel; 5. the paper round
step "sequential against parallel (ulimit -n 1024)" "$PY" "$ROOT/benchmarks/gpu_check.py" --equality \
  ${BUDGET:+--deadline $(( $(left) - 270 > 60 ? $(left) - 270 : 60 ))} "${args[@]}"
paper_round() {
  if [ -z "$BUDGET" ]; then "$PY" "$ROOT/benchmarks/gpu_check.py" "${args[@]}"; return; fi
  local seconds; seconds=$(left)
  if [ "$seconds" -lt 30 ]; then echo "no time left in --budget $BUDGET for the paper round"; return 124; fi
  timeout -k 30 "$seconds" "$PY" "$ROOT/benchmarks/gpu_check.py" "${args[@]}"
  local rc=$?
  [ "$rc" -ne 124 ] || echo "the paper round was stopped at --budget $BUDGET s (after $seconds s): no figures"
  return "$rc"
}
step "paper round" paper_round

if [ ${#FAILED[@]} -gt 0 ]; then
  echo "gpu_check: failed: $(IFS=';'; echo "${FAILED[*]}" | sed 's/;/; /g') ($(( SECONDS - START )) s)" >&2
  exit 1
fi
echo "gpu_check: every step passed ($(( SECONDS - START )) s)" >&2
