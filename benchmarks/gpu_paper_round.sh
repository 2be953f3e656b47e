#!/usr/bin/env bash
# One COSMOS round of configs/cifar100.yaml (25 clients, MobileNetV2 + SqueezeNet clients, 5 VGG16 teachers,
# bf16-mixed) on whatever GPUs exist; prints seconds per round, images per second per stage and peak GPU
# memory, and ends with one JSON line. Without network access CIFAR-100 is replaced by a same-shape uint8
# tensor set (50,000 + 10,000 random 32x32x3 images, 100 classes), and the script says so.
#   benchmarks/gpu_paper_round.sh [extra cosmos-pl overrides, e.g. --executor.kind parallel --executor.workers_per_device 4]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
ARGS=()
if ! "$PY" -c "import torchvision; torchvision.datasets.CIFAR100('data', train=True, download=True)" >/dev/null 2>&1; then
  echo "CIFAR-100 could not be loaded or downloaded: using a same-shape random uint8 tensor set instead (timing only)."
  "$PY" - <<'PYEOF'
import numpy as np, os
os.makedirs("data", exist_ok=True)
rng = np.random.default_rng(0)
np.savez("data/cifar100_shape.npz",
         x_train=rng.integers(0, 256, (50000, 32, 32, 3), dtype=np.uint8), y_train=np.arange(50000) % 100,
         x_test=rng.integers(0, 256, (10000, 32, 32, 3), dtype=np.uint8), y_test=np.arange(10000) % 100,
         classes=np.array([f"class_{i}" for i in range(100)]))
PYEOF
  ARGS+=(--data.dataset cosmos_pl.data.NpzData --data.dataset.path data/cifar100_shape.npz --algorithm.b0 inf)
fi
exec "$PY" benchmarks/paper_round.py --config configs/cifar100.yaml "${ARGS[@]}" "$@"
