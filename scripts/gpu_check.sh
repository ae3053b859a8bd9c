#!/usr/bin/env bash
# GPU check for whoever has a CUDA GPU: the gpu-marked tests, then the kernel benchmark, in < 5 min.
#
#   scripts/gpu_check.sh [RESULTS_DIR]        (default: gpu-results/<UTC timestamp>)
#
# Writes into RESULTS_DIR: gpu-tests.xml + gpu-tests.log (pytest -m gpu), kernel.json + kernel.png +
# bench-kernel.log (python -m paged bench kernel). Exits non-zero if a step fails; each step has a timeout.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
OUT="${1:-gpu-results/$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$OUT"
t0=$SECONDS

"$PYTHON" - <<'PY'
import sys
import torch
if not torch.cuda.is_available():
    sys.exit("gpu_check: no CUDA GPU visible to torch; nothing to check (the CPU suite is plain `pytest`)")
print(f"gpu_check: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
PY

echo "== [$((SECONDS - t0)) s] gpu tests (pytest -m gpu)"
timeout 150 "$PYTHON" -m pytest tests -m gpu -q -p no:cacheprovider --junitxml "$OUT/gpu-tests.xml" \
    2>&1 | tee "$OUT/gpu-tests.log"

echo "== [$((SECONDS - t0)) s] kernel benchmark (python -m paged bench kernel)"
timeout 240 "$PYTHON" -m paged bench kernel --out "$OUT" 2>&1 | tee "$OUT/bench-kernel.log"

echo "== [$((SECONDS - t0)) s] done; results in $OUT"
ls -l "$OUT"
