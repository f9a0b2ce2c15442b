# bench/bench_models.sh — sourced by the vs_llamacpp_* scripts: the model files they compare, made
# where missing: random weights in a preset's real shape (`make-tiny-model --shape S --tokenizer`,
# Q8_0, the embedded tokenizer so that llama.cpp loads them), other types requantized from it by
# llama.cpp's own llama-quantize, so both engines read the same bytes.
#
#   bench_models NAME DIR BUILD QUANTIZE "SHAPES" "TYPES"   fills the array `files` (DIR/S-T.gguf for
#                                                         each shape S and type T); NAME prefixes messages
bench_models() {
  local name=$1 dir=$2 build=$3 quantize=$4 shapes=$5 types=$6 s t q8 f
  files=()
  for s in $shapes; do
    q8=$dir/$s-q8_0.gguf
    if [ ! -s "$q8" ]; then
      echo "$name: making $q8" >&2
      "$build/make-tiny-model" --shape "$s" --tokenizer --out "$q8.tmp" >/dev/null && mv "$q8.tmp" "$q8"
    fi
    for t in $types; do
      f=$dir/$s-$t.gguf
      if [ ! -s "$f" ]; then
        [ -x "$quantize" ] || { echo "$name: missing llama-quantize '$quantize' (set LLAMA_QUANTIZE=...)" >&2; exit 2; }
        echo "$name: quantizing $f" >&2
        "$quantize" --allow-requantize "$q8" "$f.tmp" "$(tr a-z A-Z <<<"$t")" >"$dir/quantize-$s-$t.log" 2>&1 ||
          { echo "$name: llama-quantize failed for $f (see $dir/quantize-$s-$t.log)" >&2; exit 2; }
        mv "$f.tmp" "$f"
      fi
      files+=("$f")
    done
  done
}
