#!/usr/bin/env bash
# Interleaved A/B: BEFORE and AFTER are two checkouts (git worktree add DIR COMMIT); each trial is a fresh
# process with PYTHONPATH on one of them. Usage: run.sh BEFORE AFTER ROUNDS KIND... > results.jsonl
set -euo pipefail
before=$1 after=$2 rounds=$3
shift 3
here=$(cd "$(dirname "$0")" && pwd)
for ((i = 1; i <= rounds; i++)); do
    for tree in before after; do
        root=$before
        [ "$tree" = after ] && root=$after
        line=$(cd /tmp && PYTHONPATH=$root python "$here/trial.py" "$@" | grep RESULT)
        echo "{\"tree\": \"$tree\", \"kind\": \"$*\", \"round\": $i, \"r\": ${line#RESULT }}"
    done
done
