#!/usr/bin/env bash
# bench/vs_llamacpp_goal.sh — every cell of issue 31's goal in one command: Q4_0, Q4_K_M, Q5_K_M,
# Q6_K and Q8_0 files of the Qwen3-0.6B and LLaMA-3.2-1B shapes, 52/32, 512/128 and 2048/64, at 1 and
# 2 threads, ROUNDS=3 interleaved rounds (bench/vs_llamacpp.sh); makes the model files it lacks.
# Measures; decides nothing. Run it on a quiet machine: it prints its own duration estimate first.
#
#   bench/vs_llamacpp_goal.sh [DIR]      model files in DIR (default /tmp/ember-goal-models)
#
# Settings (environment): QUICK=1  the reduced mode: 1 round, no warm-up, 2 threads only (every type,
#                                  shape and length: ~20 min against ~6 h for the full run)
#                         OUT=F    results as F.jsonl / F.json / F.md (default DIR/vs-goal-DATE)
#                         any other bench/vs_llamacpp.sh setting (LLAMA_CPU, KV, EMBER_BUILD, ...)
# The models are made as docs/performance.md "Models" says: random weights in the real shapes
# (make-tiny-model --shape S --tokenizer, Q8_0), requantized by llama.cpp's own llama-quantize, so
# both engines read the same bytes.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${EMBER_BUILD:-$root/build}
dir=${1:-/tmp/ember-goal-models}
quantize=${LLAMA_QUANTIZE:-$root/../shared/bench/llama.cpp/llama-quantize}
die() { echo "vs_llamacpp_goal: $*" >&2; exit 2; }
[ -x "$build/make-tiny-model" ] || die "missing $build/make-tiny-model (cmake --build build)"
[ -x "$quantize" ] || die "missing llama-quantize '$quantize' (set LLAMA_QUANTIZE=...)"
mkdir -p "$dir"

shapes="qwen3-0.6b llama3.2-1b"
types="q4_0 q4_k_m q5_k_m q6_k q8_0"
# shellcheck source=bench/bench_models.sh
. "$root/bench/bench_models.sh"
bench_models vs_llamacpp_goal "$dir" "$build" "$quantize" "$shapes" "$types"

if [ "${QUICK:-0}" = 1 ]; then
  export ROUNDS=1 WARMUP=0 THREADS=2
else
  export ROUNDS=${ROUNDS:-3} WARMUP=${WARMUP:-1} THREADS=${THREADS:-"1 2"}
fi
export LENGTHS=${LENGTHS:-"52/32 512/128 2048/64"}
export OUT=${OUT:-$dir/vs-goal-$(date -u +%Y%m%d-%H%M)}

# Duration estimate: tokens each cell runs (ember: prefill P and decode G; llama-bench: prefill P,
# then decode G at depth P, which prefills P again), each run twice with a warm-up, over rough
# speeds of 2 cores of a Zen 3 (2 threads: Qwen3-0.6B 150 tok/s prefill, 30 decode; LLaMA-1B half;
# 1 thread half again) plus ~3 s of loading per run.
est=$(awk -v lengths="$LENGTHS" -v threads="$THREADS" -v rounds="$ROUNDS" -v warm="$WARMUP" -v ntypes=5 '
  BEGIN { n = split(lengths, L, " "); m = split(threads, T, " "); s = 0
    for (sh = 1; sh <= 2; sh++) for (i = 1; i <= m; i++) for (j = 1; j <= n; j++) {
      split(L[j], pg, "/"); f = (sh == 1 ? 1 : 0.5) * T[i] / 2; pp = 150 * f; tg = 30 * f
      s += (1 + warm) * ((pg[1] / pp + pg[2] / tg) + pg[1] / pp + (pg[1] / pp + pg[2] / tg)) + 3 * 3 * (1 + warm) }
    printf "%d", s * ntypes * rounds / 60 }')
echo "vs_llamacpp_goal: ${#files[@]} files x threads '$THREADS' x lengths '$LENGTHS' x $ROUNDS round(s): about $est min (a rough estimate; each round prints its real pace)" >&2
exec "$root/bench/vs_llamacpp.sh" "${files[@]}"
