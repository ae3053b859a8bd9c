#!/usr/bin/env bash
# GPU check, one command for whoever has one CUDA GPU (sized for one H200: about 7 minutes, 9 at most):
# the GPU tests, the kernel and engine benchmarks, the learner-kernel benchmark, the engine on a model,
# decode's roofline beside the measured kernels and the compile report, every result in one dated folder
# under docs/gpu/ that chapters 04 and 08 read once it is committed.
#
#   scripts/gpu_check.sh [RESULTS_DIR]      (default: docs/gpu/<gpu>-<UTC date>, e.g. docs/gpu/h200-2026-12-14)
#
# Then: git add docs/gpu/<folder> && git commit (chapter 04 reads the newest docs/gpu/*/kernel.json).
#
# Environment: PYTHON (default python), MODEL (a local model folder or a cached hub name for the last part;
# default: the course's built-in model), QUICK=1 (the benchmarks' --quick sizes), BUDGET_S (default 560),
# ALLOW_CPU=1 (run anyway without a GPU: a dry run of this script itself, into gpu-results/ by default).
#
# Parts, each under its own timeout and never fatal to the next:
#   doctor    python -m paged doctor                                  -> doctor.log
#   tests     pytest -m gpu                                           -> gpu-tests.xml, gpu-tests.log
#   kernel    python -m paged bench kernel                            -> kernel.json, kernel.png, kernel.log
#   roofline  python -m paged bench kernel --roofline                 -> roofline.md / .json: measured vs the
#             byte floor at this GPU's bandwidth (a model), with the compile report's row for this GPU
#   engine    python -m paged bench engine                            -> engine.json, engine.log (+ PNG)
#   exercise  python -m paged bench kernel --impl solutions --quick   -> exercise/kernel.json, exercise.log
#   model     LLM(MODEL).generate on 64 seeded prompts                -> model.json, model.log
#   compile   python -m paged bench kernel --compile (sm_80 and sm_90, no GPU needed; checks spills,
#             load widths and the committed report)                   -> kernels.json, kernels.md, compile.log
# status.json lists each part's exit code (0 ok, 124 timed out, "skipped" when the budget ran out) and
# seconds. The script exits 0 when every part passed, else 1 (2: nothing could run, with the reason).
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
BUDGET_S="${BUDGET_S:-560}"
QUICK_FLAG=""
[ "${QUICK:-0}" = "1" ] && QUICK_FLAG="--quick"

missing() {  # missing WHAT HOW: say what is missing and how to get it, write status.json if we can, exit 2
    echo "gpu_check: $1"
    echo "gpu_check: $2"
    if [ -n "${OUT:-}" ]; then mkdir -p "$OUT" && printf '{"gpu": false, "error": "%s"}\n' "$1" > "$OUT/status.json"; fi
    exit 2
}

command -v "$PYTHON" >/dev/null 2>&1 || missing "no '$PYTHON' on PATH" "set PYTHON=/path/to/python (the one with torch)"
"$PYTHON" -c "import torch" 2>/dev/null || missing "torch is not importable by $PYTHON" \
    "activate the course's environment (README: pip install torch, then pip install -e '.[dev]')"
HAS_GPU=$("$PYTHON" -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null || echo 0)
if [ "$HAS_GPU" = "1" ]; then
    SLUG=$("$PYTHON" -c "import re, torch; n = torch.cuda.get_device_name(0).lower().replace('nvidia', ''); \
print(re.sub('[^a-z0-9]+', '-', n).strip('-') or 'gpu')")
    OUT="${1:-docs/gpu/${SLUG}-$(date -u +%Y-%m-%d)}"
elif [ "${ALLOW_CPU:-0}" = "1" ]; then
    OUT="${1:-gpu-results/cpu-dry-run-$(date -u +%Y%m%dT%H%M%SZ)}"
else
    OUT="${1:-}"
    missing "no CUDA GPU visible to torch; nothing to check (the CPU suite is plain \`pytest\`)" \
        "run this on a machine with an NVIDIA GPU and a CUDA build of torch (ALLOW_CPU=1 for a dry run)"
fi
"$PYTHON" -c "import paged.kernels" 2>/dev/null || missing "cannot import paged.kernels" \
    "install the course first (pip install -e . --no-deps), or, on an image whose packages you cannot change, run from the repository root with PYTHONPATH=\$PWD after 'ln -s ../kernels paged/kernels' (kernels/ is mapped to paged.kernels by the install)"
"$PYTHON" -c "import triton" 2>/dev/null || missing "triton is not importable" "pip install triton (Linux wheels only)"
"$PYTHON" -c "import pytest" 2>/dev/null || missing "pytest is not importable" "pip install -e '.[dev]'"
mkdir -p "$OUT"
echo "gpu_check: results go to $OUT (budget ${BUDGET_S} s)"
t0=$SECONDS
STATUS=()
FAILED=0

# run_part NAME CAP_SECONDS COMMAND...: log to $OUT/NAME.log (and the terminal), record rc and seconds.
run_part() {
    local name=$1 cap=$2
    shift 2
    local left=$((BUDGET_S - (SECONDS - t0)))
    if [ "$left" -lt 20 ]; then
        echo "== $name: skipped (time budget of ${BUDGET_S} s used up)"
        STATUS+=("\"$name\": {\"rc\": \"skipped\", \"seconds\": 0}")
        FAILED=1
        return
    fi
    [ "$cap" -gt "$left" ] && cap=$left
    echo "== [$((SECONDS - t0)) s] $name (timeout ${cap} s): $*"
    local start=$SECONDS
    timeout --kill-after=10 "$cap" "$@" 2>&1 | tee "$OUT/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc after $((SECONDS - start)) s"
    STATUS+=("\"$name\": {\"rc\": $rc, \"seconds\": $((SECONDS - start))}")
    [ "$rc" -ne 0 ] && FAILED=1
}

run_part doctor 30 "$PYTHON" -m paged doctor
run_part tests 120 "$PYTHON" -m pytest tests -m gpu -n 0 -q -p no:cacheprovider --junitxml "$OUT/gpu-tests.xml"
[ -f "$OUT/tests.log" ] && mv "$OUT/tests.log" "$OUT/gpu-tests.log"
run_part kernel 200 "$PYTHON" -m paged bench kernel $QUICK_FLAG --out "$OUT"
run_part roofline 20 "$PYTHON" -m paged bench kernel --roofline --out "$OUT"
run_part engine 90 "$PYTHON" -m paged bench engine $QUICK_FLAG --out "$OUT"
run_part exercise 40 "$PYTHON" -m paged bench kernel --impl solutions --quick --out "$OUT/exercise"
run_part model 60 "$PYTHON" - "$OUT/model.json" "${MODEL:-}" <<'PY'
# The engine on a real model: 64 seeded prompts of 32-256 tokens, 64 greedy tokens each (EOS ignored).
import json, sys, time
import torch
from paged_course.bench import environment
from paged.engine.llm import LLM
from paged.core.sequence import SamplingParams

out, name = sys.argv[1], sys.argv[2] or None
llm = LLM(name, seed=0)
vocab = llm.model.config.vocab_size
gen = torch.Generator().manual_seed(0)
prompts = [torch.randint(3, vocab, (int(n),), generator=gen).tolist()
           for n in torch.randint(32, 257, (64,), generator=gen)]
params = SamplingParams(max_tokens=64, ignore_eos=True)
llm.generate([p[::-1] for p in prompts[:2]], params, use_tqdm=False)  # warm-up, no prefix hits later
start = time.perf_counter()
outs = llm.generate(prompts, params, use_tqdm=False)
seconds = time.perf_counter() - start
tokens = sum(len(o.outputs[0].token_ids) for o in outs)
record = {"model": name or "built-in", "requests": len(prompts), "generated_tokens": tokens, "seconds": seconds,
          "tok_s": tokens / seconds, "stats": llm.stats(), "environment": environment()}
json.dump(record, open(out, "w"), indent=2, default=str)
print(f"{record['model']}: {tokens} tokens in {seconds:.2f} s = {tokens / seconds:.0f} tok/s on "
      f"{record['environment']['device']}")
PY

run_part compile 120 "$PYTHON" -m paged bench kernel --compile --out "$OUT"
# the roofline again, now beside this run's own compile report (kernels.json)
[ -f "$OUT/kernels.json" ] && "$PYTHON" -m paged bench kernel --roofline --out "$OUT" > "$OUT/roofline.log" 2>&1

STATUS+=("\"total_seconds\": $((SECONDS - t0))")
GPU=$([ "$HAS_GPU" = "1" ] && echo true || echo false)
(IFS=,; printf '{"gpu": %s, %s}\n' "$GPU" "${STATUS[*]}") > "$OUT/status.json"
echo "== [$((SECONDS - t0)) s] done; results in $OUT"
cat "$OUT/status.json"
ls -l "$OUT"
[ "$HAS_GPU" = "1" ] && echo "commit them: git add $OUT && git commit -m 'GPU run: $OUT'"
exit "$FAILED"
