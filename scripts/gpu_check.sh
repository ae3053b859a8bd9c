#!/usr/bin/env bash
# GPU check for whoever has one CUDA GPU: GPU tests, kernel benchmark, engine benchmark, the engine on a
# model, in under 10 minutes, with every result in one folder.
#
#   scripts/gpu_check.sh [RESULTS_DIR]        (default: gpu-results/<UTC timestamp>)
#
# Environment: PYTHON (default python), MODEL (a local model folder or a cached hub name for the last part;
# default: the course's built-in model), QUICK=1 (the benchmarks' --quick sizes), BUDGET_S (default 570),
# ALLOW_CPU=1 (run anyway without a GPU: a dry run of this script itself).
#
# Parts, each under its own timeout and never fatal to the next:
#   doctor   python -m paged doctor                       -> doctor.log
#   tests    pytest -m gpu                                -> gpu-tests.xml, gpu-tests.log
#   kernel   python -m paged bench kernel                 -> kernel.json, kernel.png, kernel.log
#   engine   python -m paged bench engine                 -> engine.json, engine.log (+ PNG when written)
#   model    LLM(MODEL).generate on 64 seeded prompts     -> model.json, model.log
# status.json lists each part's exit code (0 ok, 124 timed out, "skipped" when the budget ran out) and
# seconds. The script exits 0 when every part passed, else 1; chapter 08 reads the JSON from gpu-results/.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
OUT="${1:-gpu-results/$(date -u +%Y%m%dT%H%M%SZ)}"
BUDGET_S="${BUDGET_S:-570}"
QUICK_FLAG=""
[ "${QUICK:-0}" = "1" ] && QUICK_FLAG="--quick"
mkdir -p "$OUT"
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

if [ "${ALLOW_CPU:-0}" != "1" ] && ! "$PYTHON" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: no CUDA GPU visible to torch; nothing to check (the CPU suite is plain \`pytest\`)"
    printf '{"gpu": false}\n' > "$OUT/status.json"
    exit 2
fi

if ! "$PYTHON" -c "import paged.kernels" 2>/dev/null; then
    echo "gpu_check: cannot import paged.kernels: install the course first (pip install -e . --no-deps), or, on an"
    echo "image whose packages you cannot change, run from the repository root with PYTHONPATH=\$PWD after"
    echo "'ln -s ../kernels paged/kernels' (kernels/ is mapped to paged.kernels by the install)"
    printf '{"gpu": true, "error": "paged.kernels not importable"}\n' > "$OUT/status.json"
    exit 2
fi

run_part doctor 60 "$PYTHON" -m paged doctor
run_part tests 150 "$PYTHON" -m pytest tests -m gpu -q -p no:cacheprovider --junitxml "$OUT/gpu-tests.xml"
[ -f "$OUT/tests.log" ] && mv "$OUT/tests.log" "$OUT/gpu-tests.log"
run_part kernel 180 "$PYTHON" -m paged bench kernel $QUICK_FLAG --out "$OUT"
run_part engine 150 "$PYTHON" -m paged bench engine $QUICK_FLAG --out "$OUT"
run_part model 90 "$PYTHON" - "$OUT/model.json" "${MODEL:-}" <<'PY'
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

STATUS+=("\"total_seconds\": $((SECONDS - t0))")
GPU=$("$PYTHON" -c "import torch; print(str(torch.cuda.is_available()).lower())" 2>/dev/null || echo false)
(IFS=,; printf '{"gpu": %s, %s}\n' "$GPU" "${STATUS[*]}") > "$OUT/status.json"
echo "== [$((SECONDS - t0)) s] done; results in $OUT"
cat "$OUT/status.json"
ls -l "$OUT"
exit "$FAILED"
