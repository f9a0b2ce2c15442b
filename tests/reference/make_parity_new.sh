#!/bin/bash
# make_parity_new.sh — (re)makes the parity fixtures of tests/fixtures/parity-new: for each case
# below, a tiny model from build/make-tiny-model, llama.cpp's logits of its prefill and greedy decode
# (llama-ref-logits), and the exact float64 ones (family_reference.py over the weights llama-quantize
# dequantizes). Only the generator's arguments and the logits are kept; the tests make the model
# again and check its sha256. Run from the repository root after building; needs the llama.cpp build
# of ../shared/bench/llama.cpp and /usr/bin/python3 with numpy. Never run by the tests.
#
#   tests/reference/make_parity_new.sh [CASE...]     (no CASE: every case)
set -euo pipefail
LLAMA=${LLAMA:-../shared/bench/llama.cpp}
OUT=tests/fixtures/parity-new
PY=/usr/bin/python3
HERE=$(dirname "$0")

# name | make-tiny-model arguments | prompt ids | greedy tokens | --inside (boundaries and heads)
# Three quantized cases keep no boundaries or heads, each for a reason the view-level specs cannot
# take yet: phi3-tiny-q8_0 runs the long LongRoPE factors, which a session picks from its context, and
# the hook-view specs open shorter sessions; on avx512 one decode head view of gptneox-tiny-q8_0 is at
# 0.14 of the logits-derived bound 0.13; qwen3moe-tiny-q8_0's fast router picks another expert on a
# near-tie in one row, so its mlp_activation there is another expert's.
CASES=(
  "gemma2-tiny-f32|--family gemma2 --dtype f32 --seed 3 --attn-softcap 2 --window 4|2,5,9,200,37,41,88,23,100,7,300,12|8|--inside"
  "gemma2-tiny-q8_0|--family gemma2 --dtype q8_0 --seed 11 --attn-softcap 3|2,17,250,31,402,77,5,19,333,64,8,120|8|--inside"
  "gemma3-tiny-f32|--family gemma3 --dtype f32 --seed 3 --layers 7 --window 4|2,5,9,200,37,41,88,23,100,7,300,12|8|--inside"
  "gemma3-tiny-q8_0|--family gemma3 --dtype q8_0 --seed 12 --rope-scale 8 --rope-base-swa 20000 --softcap 10|2,31,8,444,96,150,7,3,222,64,51,9|8|--inside"
  "gemma3-small-q4_k|--family gemma3 --dtype q4_k --seed 6 --layers 6 --hidden 256 --heads 4 --kv-heads 1 --head-dim 128 --ff 512 --window 5|2,13,91,260,7,48,180,310,2,99,140,17|8|--inside"
  "olmo2-tiny-f32|--family olmo2 --dtype f32 --seed 3|2,5,9,200,37,41,88,23,100,7,300,12|8|--inside"
  "olmo2-tiny-q8_0|--family olmo2 --dtype q8_0 --seed 13 --kv-heads 4 --rope-base 10000|2,71,9,260,14,333,48,5,190,77,21,404|8|--inside"
  "olmo2-small-q4_k|--family olmo2 --dtype q4_k --seed 8 --layers 3 --hidden 256 --heads 4 --ff 512|2,19,88,301,6,45,212,130,9,77,260,33|8|--inside"
  "phi3-tiny-f32|--family phi3 --dtype f32 --seed 3|2,5,9,200,37,41,88,23,100,7,300,12|8|--inside"
  "phi3-tiny-q8_0|--family phi3 --dtype q8_0 --seed 14 --rope-freqs|2,71,9,260,14,333,48,5,190,77,21,404|8|"
  "phi3-attn-tiny-f32|--family phi3 --dtype f32 --seed 21 --rope-attn-factor 1.19|2,64,9,311,27,140,5,86,203,11,49,350|8|--inside"
  "phi3-small-q4_k|--family phi3 --dtype q4_k --seed 9 --layers 3 --hidden 256 --heads 4 --ff 512 --rope-freqs --context 4096|2,19,88,301,6,45,212,130,9,77,260,33|8|--inside"
  "qwen3moe-tiny-f32|--family qwen3moe --dtype f32 --seed 3|2,5,9,200,37,41,88,23,100,7,300,12|8|--inside"
  "qwen3moe-tiny-q8_0|--family qwen3moe --dtype q8_0 --seed 15 --experts 8 --experts-used 3 --expert-ff 32|2,71,9,260,14,333,48,5,190,77,21,404|8|"
  "qwen3moe-small-q4_k|--family qwen3moe --dtype q4_k --seed 10 --layers 3 --hidden 256 --heads 4 --kv-heads 2 --head-dim 64 --ff 512 --experts 4 --experts-used 2 --expert-ff 256|2,19,88,301,6,45,212,130,9,77,260,33|8|--inside"
  "gemma2-small-q4_k|--family gemma2 --dtype q4_k --seed 5 --layers 3 --hidden 256 --heads 4 --kv-heads 2 --head-dim 128 --ff 512 --window 6|2,44,61,77,19,250,333,401,17,90,6,211|8|--inside"
  "gptneox-tiny-f32|--family gptneox --dtype f32 --seed 3|2,5,9,200,37,41,88,23,100,7,300,12|8|--inside"
  "gptneox-tiny-q8_0|--family gptneox --dtype q8_0 --seed 11|2,17,250,31,402,77,5,19,333,64,8,120|8|"
  "gptneox-seq-tiny-f32|--family gptneox --dtype f32 --seed 7 --sequential-residual|2,5,9,200,37,41,88,23,100,7,300,12|8|--inside"
  "gptneox-seq-tiny-q8_0|--family gptneox --dtype q8_0 --seed 17 --sequential-residual|2,31,8,444,96,150,7,3,222,64,51,9|8|--inside"
  "gptneox-small-q4_k|--family gptneox --dtype q4_k --seed 5 --layers 3 --hidden 256 --heads 4 --ff 512|2,44,61,77,19,250,333,401,17,90,6,211|8|--inside"
)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

make_case() {
    local name=$1 args=$2 ids=$3 n_gen=$4 inside=$5 dir="$OUT/$1"
    echo "== $name"
    mkdir -p "$dir"
    # shellcheck disable=SC2086
    "${BUILD:-build}"/make-tiny-model $args --out "$tmp/model.gguf"
    "$LLAMA/llama-ref-logits" -m "$tmp/model.gguf" --tokens "$ids" -n "$n_gen" --all-logits \
        --logits-out "$tmp/pre.npy" --decode-logits-out "$tmp/dec.npy" >"$tmp/ll.log" 2>&1
    local gen
    gen=$(sed -n 's/^gen_tokens ([0-9]*): //p' "$tmp/ll.log" | tr ' ' ',')
    if [[ $args == *"--dtype f32"* ]]; then
        cp "$tmp/model.gguf" "$tmp/f32.gguf"
    else
        "$LLAMA/llama-quantize" --allow-requantize "$tmp/model.gguf" "$tmp/f32.gguf" F32 >/dev/null 2>&1
    fi
    # shellcheck disable=SC2086
    "$PY" "$HERE/family_reference.py" "$tmp/f32.gguf" "$ids" "$gen" "$dir" $inside
    "$PY" - "$tmp" "$dir" "$name" "$args" "$ids" "$gen" <<'EOF'
import hashlib, json, math, sys
import numpy as np
tmp, d, name, args, ids, gen = sys.argv[1:7]
prompt, greedy = [int(t) for t in ids.split(",")], [int(t) for t in gen.split(",")]
P, N = len(prompt), len(greedy)
pre, dec = np.load(tmp + "/pre.npy"), np.load(tmp + "/dec.npy")
ll = np.concatenate([pre[:P], dec[:N]]).astype("<f4")
np.save(d + "/llamacpp_logits.npy", ll)
ex = np.load(d + "/exact_logits.npy")
rows = P + N
ex_rows = ex[P - 1:rows].argmax(axis=1)
rel = float(np.abs(ll - ex).max() / np.abs(ex).max())
# at least twice the distance between the references, rounded up to two digits (floor 1e-4)
tol = max(1e-4, float("%.2g" % (2.5 * rel)))
tol = tol if tol >= 2 * rel else float("%.2g" % (3 * rel))
top2 = np.sort(ex, axis=1)[:, -2:]
case = {
    "family": args.split("--family ")[1].split()[0],
    "dtype": args.split("--dtype ")[1].split()[0],
    "make_tiny_model": args,
    "model_sha256": hashlib.sha256(open(tmp + "/model.gguf", "rb").read()).hexdigest(),
    "prompt_ids": prompt,
    "greedy_ids": greedy,
    "n_vocab": int(ex.shape[1]),
    "rows": "row i = logits after the first i+1 tokens of prompt_ids + greedy_ids",
    "tolerance": {"exact_rel": 1e-4, "llamacpp_rel": tol,
                  "greedy_ids_must_match": bool((ex_rows[:N] == np.array(greedy)).all())},
    "llamacpp_vs_exact": {"rel": rel, "max_abs": float(np.abs(ll - ex).max()),
                          "argmax_agree": int((ll.argmax(1) == ex.argmax(1)).sum()), "rows": rows},
    "exact_top2_margin": [round(float(b - a), 6) for a, b in top2],
    "reference": "llama.cpp d32676d (llama-ref-logits: CPU, 1 thread, f32 KV cache, flash attention off) "
                 "and tests/reference/family_reference.py (float64 over the weights llama-quantize dequantizes)",
}
json.dump(case, open(d + "/case.json", "w"), indent=1)
print("%s: llama.cpp vs exact rel %.3g -> llamacpp_rel %.3g, greedy_ids_must_match %s" %
      (name, rel, tol, case["tolerance"]["greedy_ids_must_match"]))
EOF
}

for c in "${CASES[@]}"; do
    IFS='|' read -r name args ids n_gen inside <<<"$c"
    if [[ $# -eq 0 ]] || [[ " $* " == *" $name "* ]]; then make_case "$name" "$args" "$ids" "$n_gen" "$inside"; fi
done
