#!/usr/bin/env bash
# bench/vs_llamacpp_families.sh — ember and llama.cpp side by side on the real shapes of the model
# families beyond LLaMA and Qwen (bench/vs_llamacpp.sh on each): Gemma 2 2B, Gemma 3 1B, Pythia 160M
# and 1B, OLMo 2 1B, and every other make-tiny-model preset of a family named in FAMILIES. Makes the
# model files it lacks (random weights in the real shape, `make-tiny-model --shape S --tokenizer`,
# Q8_0, the embedded tokenizer so that llama.cpp loads them; TYPES others requantized by llama.cpp's
# own llama-quantize, so both engines read the same bytes). Measures; decides nothing. Run it on a
# quiet machine.
#
#   bench/vs_llamacpp_families.sh [DIR]      model files in DIR (default /tmp/ember-family-models)
#
# Settings (environment):
#   SHAPES    the presets (default: gemma2-2b gemma3-1b pythia-160m pythia-1b olmo2-1b, then any other
#             preset make-tiny-model lists whose name starts with one of FAMILIES)
#   FAMILIES  name prefixes of the extra presets (default "phi3 qwen3moe qwen3-30b")
#   TYPES     quantization types per shape (default "q8_0"; e.g. "q8_0 q4_k_m")
#   QUICK=1   one shape's check of the script: 1 round, no warm-up, 2 threads, LENGTHS 16/8 (the
#             shape: SHAPES, default pythia-160m)
#   OUT=F     results as F.jsonl / F.json / F.md (default DIR/vs-families-DATE)
#   any other bench/vs_llamacpp.sh setting (ROUNDS, LENGTHS, THREADS, KV, LLAMA_CPU, EMBER_BUILD, ...)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${EMBER_BUILD:-$root/build}
dir=${1:-/tmp/ember-family-models}
quantize=${LLAMA_QUANTIZE:-$root/../shared/bench/llama.cpp/llama-quantize}
die() { echo "vs_llamacpp_families: $*" >&2; exit 2; }
[ -x "$build/make-tiny-model" ] || die "missing $build/make-tiny-model (cmake --build build)"
mkdir -p "$dir"

# the presets make-tiny-model has (its usage line: --shape a|b|c)
presets=$("$build/make-tiny-model" --help | sed -n 's/.*--shape \([^ ]*\) --out.*/\1/p' | head -1 | tr '|' ' ')
[ -n "$presets" ] || die "cannot read the presets from make-tiny-model --help"
if [ "${QUICK:-0}" = 1 ]; then
  shapes=${SHAPES:-pythia-160m}
else
  shapes=${SHAPES:-}
  if [ -z "$shapes" ]; then
    shapes="gemma2-2b gemma3-1b pythia-160m pythia-1b olmo2-1b"
    for p in $presets; do
      for f in ${FAMILIES:-phi3 qwen3moe qwen3-30b}; do [[ $p == "$f"* ]] && shapes+=" $p"; done
    done
  fi
fi
for s in $shapes; do [[ " $presets " == *" $s "* ]] || die "no make-tiny-model preset '$s' (presets: $presets)"; done
types=${TYPES:-q8_0}

# shellcheck source=bench/bench_models.sh
. "$root/bench/bench_models.sh"
bench_models vs_llamacpp_families "$dir" "$build" "$quantize" "$shapes" "$types"

if [ "${QUICK:-0}" = 1 ]; then
  export ROUNDS=1 WARMUP=0 THREADS=2 LENGTHS=${LENGTHS:-16/8}
else
  export ROUNDS=${ROUNDS:-3} WARMUP=${WARMUP:-1} THREADS=${THREADS:-2} LENGTHS=${LENGTHS:-"52/32 512/128 2048/64"}
fi
export OUT=${OUT:-$dir/vs-families-$(date -u +%Y%m%d-%H%M)}
echo "vs_llamacpp_families: ${#files[@]} file(s) ($shapes; $types) x threads '$THREADS' x lengths '$LENGTHS' x $ROUNDS round(s)" >&2
exec "$root/bench/vs_llamacpp.sh" "${files[@]}"
