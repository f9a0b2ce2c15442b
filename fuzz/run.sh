#!/usr/bin/env bash
# fuzz/run.sh NAME SECONDS [libFuzzer flags...] — builds the libFuzzer harnesses (build-fuzz/, clang,
# -fsanitize=fuzzer,address,undefined), makes the seed corpus for NAME and fuzzes it for SECONDS.
# NAME: gguf | tokenizer | artifact | selectors | flags. Prints one summary line: executions, coverage, corpus size, crashes.
# Exit 0: no crash; 1: a crash, leak or sanitizer report (the reproducer is in build-fuzz/crashes/);
# 77: skipped (clang missing), with a message.
set -euo pipefail
cd "$(dirname "$0")/.."

name=${1:-}
seconds=${2:-}
if [ -z "$name" ] || [ -z "$seconds" ]; then
  echo "usage: fuzz/run.sh gguf|tokenizer|artifact|selectors|flags SECONDS [libFuzzer flags...]" >&2
  exit 2
fi
shift 2
case "$name" in gguf|tokenizer|artifact|selectors|flags) ;;
  *) echo "fuzz/run.sh: unknown harness '$name' (gguf, tokenizer, artifact, selectors, flags)" >&2; exit 2;; esac

if ! command -v clang >/dev/null 2>&1; then
  echo "fuzz/run.sh: skipped: clang is not installed (apt-get install clang)"
  exit 77
fi

dir=build-fuzz
if ! CC=clang cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DEMBER_FUZZ=ON >/dev/null ||
   ! cmake --build "$dir" -j2 --target "fuzz_$name" make-tiny-model ember-lua >/dev/null; then
  echo "fuzz $name: FAILED to build (see the compiler output above)"
  exit 1
fi

fixtures=${EMBER_FIXTURES:-../shared/fixtures}
corpus=$dir/corpus-$name
mkdir -p "$corpus" "$dir/crashes"
case "$name" in
  gguf)
    # small project-made models of every family and dtype (the shared fixtures are megabytes:
    # too slow to mutate), with and without the embedded tokenizer
    for fam in llama qwen3 qwen2 gemma4 gpt2; do
      for dt in f32 q8_0; do
        for tok in "--no-tokenizer --vocab 32" "--vocab 260"; do
          out="$corpus/seed-$fam-$dt-${tok// /_}.gguf"
          [ -f "$out" ] || "$dir/make-tiny-model" --family "$fam" --dtype "$dt" --layers 2 --hidden 32 --heads 2 \
            --kv-heads 1 --ff 32 --context 8 $tok --out "$out" >/dev/null 2>&1 || true
        done
      done
    done
    ;;
  tokenizer)
    # the fixtures' tokenizer.json files cut down to their first few hundred ids, read at run time
    lua5.4 fuzz/make_tokenizer_seeds.lua "$fixtures/tokenizers" "$corpus"
    ;;
  artifact)
    # small artifacts written by the real writer (1.1.0 and the 1.0.0 form), packed for the harness
    "$dir/ember-lua" fuzz/make_artifact_seeds.lua "$corpus"
    ;;
  selectors | flags)
    # what users type (selector values; command lines of the docs), NUL-separated
    lua5.4 fuzz/make_text_seeds.lua "$name" "$corpus"
    ;;
esac

log=$dir/fuzz-$name.log
status=0
"$dir/fuzz/fuzz_$name" "$corpus" -max_total_time="$seconds" -print_final_stats=1 -rss_limit_mb=2048 \
  -artifact_prefix="$dir/crashes/$name-" "$@" >"$log" 2>&1 || status=$?
execs=$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -Eo '[0-9]+$' || echo 0)
cov=$(grep -Eo 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -1 || true)
corp=$(grep -Eo 'corp: [0-9]+/[0-9]+[a-zA-Z]*' "$log" | tail -1 || true)
if [ "$status" -ne 0 ]; then
  echo "fuzz $name: FAILED after $execs executions ($cov, $corp); see $log and $dir/crashes/"
  grep -E 'ERROR: |SUMMARY: ' "$log" | head -5
  exit 1
fi
echo "fuzz $name: $seconds s, $execs executions, $cov, $corp, crashes: 0"
