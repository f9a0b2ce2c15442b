#!/usr/bin/env bash
# bench/sweep_reuse.sh — an after_layer sweep over every layer and position, evaluated from each
# cell's position on (the default: the corrupted run's KV cache reused, the shared prefix certified
# without a pass) against every cell from position 0 (--no-reuse); both grids must be bit-identical.
#
#   bench/sweep_reuse.sh [MODEL.gguf] [ROUNDS] [extra ember sweep args]
#
# Without MODEL it makes the Qwen3-0.6B shape (28 layers, random Q8_0 weights, the tiny tokenizer)
# in a scratch directory. The two prompts tokenize to 35 tokens each on that tokenizer (checked:
# the sweep refuses prompts of different lengths). Runs alternate, and each mode's median wall
# time over the rounds is printed, with cells/s.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
ember=${EMBER:-$here/build/ember}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
model=${1:-}
rounds=${2:-3}
shift $(($# > 2 ? 2 : $#))
if [[ -z $model ]]; then
  model=$tmp/qwen3-0.6b.gguf
  "$here/build/make-tiny-model" --shape qwen3-0.6b --tokenizer --out "$model" >/dev/null
fi
clean=${CLEAN:-"When Mary and John went to the store, John gave a drink to"}
corrupted=${CORRUPTED:-"When John and Mary went to the store, John gave a drink to"}
run() { # run MODE DIR: one sweep, prints its wall seconds
  local start end
  start=$(date +%s.%N)
  "$ember" sweep --model "$model" --clean "$clean" --corrupted "$corrupted" --out "$2" --progress none --no-plot \
    "${@:3}" ${1:+$1} 2>"$2.log" || { cat "$2.log" >&2; exit 1; }
  end=$(date +%s.%N)
  awk -v a="$start" -v b="$end" 'BEGIN {print b - a}'
}
for ((r = 1; r <= rounds; r++)); do
  run "" "$tmp/reuse$r" "$@" >>"$tmp/reuse.t"
  run --no-reuse "$tmp/noreuse$r" "$@" >>"$tmp/noreuse.t"
  "$ember" sweep compare "$tmp/reuse$r" "$tmp/noreuse$r" >"$tmp/cmp.txt" || { cat "$tmp/cmp.txt" >&2; exit 1; }
done
cells=$(grep -o '"index"' "$tmp/reuse1/manifest.json" | wc -l)
median() { sort -g | awk '{v[NR] = $1} END {if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
a=$(median <"$tmp/reuse.t")
b=$(median <"$tmp/noreuse.t")
printf 'model %s, %d cells, %d rounds (grids bit-identical: %s)\n' "$(basename "$model")" "$cells" "$rounds" \
  "$(tail -1 "$tmp/cmp.txt")"
printf '%-12s %10s %10s\n' mode seconds cells/s
awk -v n="$cells" -v a="$a" -v b="$b" 'BEGIN {
  printf "%-12s %10.2f %10.2f\n", "reuse", a, n / a
  printf "%-12s %10.2f %10.2f\n", "no-reuse", b, n / b
  printf "speed-up %.2fx\n", b / a }'
