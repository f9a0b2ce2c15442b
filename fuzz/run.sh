#!/usr/bin/env bash
# fuzz/run.sh NAME SECONDS [libFuzzer flags...] — builds the libFuzzer harnesses (build-fuzz/, clang,
# -fsanitize=fuzzer,address,undefined), makes the seed corpus for NAME and fuzzes it for SECONDS.
# NAME: gguf | tokenizer | artifact | selectors | flags | formats. Prints one summary line: executions, coverage,
# corpus size, crashes. The libFuzzer flags go through as they are (e.g. -runs=N, -timeout=S).
# fuzz/run.sh long [NAME...] — the long runs of docs/robustness.md: each named harness (default: all
# six), one after the other, from its corpus until 10,000,000 executions or 1,800 s, whichever comes
# first (FUZZ_LONG_RUNS, FUZZ_LONG_SECONDS), with -timeout=30; each run's figures (tree, start, load
# average, wall time, executions, exec/s, coverage, corpus, peak RSS, findings) are appended as a
# table row to build-fuzz/long-runs.md (FUZZ_RECORD names another file; a single run appends there too).
# Exit 0: no crash; 1: a crash, leak or sanitizer report (the reproducer is in build-fuzz/crashes/);
# 77: skipped (clang missing), with a message.
set -euo pipefail
self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
cd "$(dirname "$0")/.."

HARNESSES="gguf tokenizer artifact selectors flags formats"
if [ "${1:-}" = long ]; then
  shift
  list=${*:-$HARNESSES}
  mkdir -p build-fuzz
  export FUZZ_RECORD=${FUZZ_RECORD:-$PWD/build-fuzz/long-runs.md}
  status=0
  for h in $list; do
    rc=0
    "$self" "$h" "${FUZZ_LONG_SECONDS:-1800}" -runs="${FUZZ_LONG_RUNS:-10000000}" -timeout=30 || rc=$?
    case $rc in 0|77) ;; *) status=1 ;; esac
  done
  echo "fuzz/run.sh long: figures in $FUZZ_RECORD"
  exit $status
fi

name=${1:-}
seconds=${2:-}
if [ -z "$name" ] || [ -z "$seconds" ]; then
  echo "usage: fuzz/run.sh gguf|tokenizer|artifact|selectors|flags|formats SECONDS [libFuzzer flags...]" >&2
  echo "       fuzz/run.sh long [NAME...]" >&2
  exit 2
fi
shift 2
case "$name" in gguf|tokenizer|artifact|selectors|flags|formats) ;;
  *) echo "fuzz/run.sh: unknown harness '$name' (gguf, tokenizer, artifact, selectors, flags, formats)" >&2; exit 2;; esac

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
  formats)
    # decision streams for each format of fuzz/drivers/formats.lua (its first byte picks the format)
    lua5.4 fuzz/make_format_seeds.lua "$corpus"
    ;;
esac

log=$dir/fuzz-$name.log
status=0
started=$(date -u +%Y-%m-%dT%H:%MZ)
load=$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo "?")
t0=$(date +%s)
"$dir/fuzz/fuzz_$name" "$corpus" -max_total_time="$seconds" -print_final_stats=1 -rss_limit_mb=2048 \
  -artifact_prefix="$dir/crashes/$name-" "$@" >"$log" 2>&1 || status=$?
wall=$(($(date +%s) - t0))
execs=$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -Eo '[0-9]+$' || echo 0)
rss=$(grep -Eo 'stat::peak_rss_mb: *[0-9]+' "$log" | grep -Eo '[0-9]+$' || echo "?")
cov=$(grep -Eo 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -1 || true)
corp=$(grep -Eo 'corp: [0-9]+/[0-9]+[a-zA-Z]*' "$log" | tail -1 || true)
if [ -n "${FUZZ_RECORD:-}" ]; then
  [ -s "$FUZZ_RECORD" ] || printf '%s\n%s\n' \
    '| harness | tree | started | load at start | wall | executions | exec/s | coverage (cov / ft) | corpus | peak RSS | findings |' \
    '|---|---|---|---|---|---|---|---|---|---|---|' >"$FUZZ_RECORD"
  findings=none
  [ "$status" -eq 0 ] || findings="FAILED (exit $status): $log"
  printf '| fuzz_%s | %s | %s | %s | %d s | %s | %d | %s | %s | %s MiB | %s |\n' "$name" \
    "$(git describe --always --dirty 2>/dev/null || echo "?")" "$started" "$load" "$wall" "$execs" \
    $((execs / (wall > 0 ? wall : 1))) "$(echo "$cov" | sed 's/cov: \([0-9]*\) ft: \([0-9]*\)/\1 \/ \2/')" \
    "${corp#corp: }" "$rss" "$findings" >>"$FUZZ_RECORD"
fi
if [ "$status" -ne 0 ]; then
  echo "fuzz $name: FAILED after $execs executions ($cov, $corp); see $log and $dir/crashes/"
  grep -E 'ERROR: |SUMMARY: ' "$log" | head -5
  exit 1
fi
echo "fuzz $name: $wall s, $execs executions, $cov, $corp, peak RSS $rss MiB, crashes: 0"
