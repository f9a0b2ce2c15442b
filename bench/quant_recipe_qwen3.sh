#!/usr/bin/env bash
# bench/quant_recipe_qwen3.sh — `ember quant-recipe` at the Qwen3-0.6B shape (random weights): A in
# f32 and B in q4_k from make-tiny-model, 32 prompts, every group (28 layers x attention and MLP,
# output, token_embd: 58), then the greedy selection. The report's timing section gives the first
# pass's and the selection's seconds; docs/quant-recipe.md says what was measured on which machine.
#
#   bench/quant_recipe_qwen3.sh [WORK_DIR] [extra quant-recipe flags, e.g. --threads 2 --no-verify]
#
# Needs about 3.5 GB of disk for the two models (kept in WORK_DIR for reruns) and as much memory
# as A's mapping plus B's repacked copy.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-/tmp/ember-quant-recipe-qwen3}
shift || true
mkdir -p "$work"
tool=$here/build/make-tiny-model
a=$work/qwen3-0.6b-f32.gguf
b=$work/qwen3-0.6b-q4_k.gguf
[ -f "$a" ] || "$tool" --shape qwen3-0.6b --dtype f32 --tokenizer --out "$a"
[ -f "$b" ] || "$tool" --shape qwen3-0.6b --dtype q4_k --tokenizer --out "$b"
prompts=$work/prompts.jsonl
: >"$prompts"
for i in $(seq 1 32); do
  printf '{"prompt": "Prompt number %d: the quick brown fox jumps over the lazy dog %d times."}\n' "$i" "$i" \
    >>"$prompts"
done
out=$work/recipe-$(date +%Y%m%d-%H%M%S)
/usr/bin/time -v "$here/build/ember" quant-recipe --reference "$a" --quantized "$b" --prompts "$prompts" \
  --out "$out" "$@" 2> >(tee "$work/stderr.log" >&2)
sed -n '/"timing"/,/}/p' "$out/report.json"
