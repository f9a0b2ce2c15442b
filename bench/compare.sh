#!/usr/bin/env bash
# bench/compare.sh — interleaved bench-engine runs of several kernel sets on one model, medians.
# The development machines are shared and noisy (±30% run to run), so configurations are run in
# turn, round after round, and each one's median over the rounds is reported.
#
#   bench/compare.sh MODEL ROUNDS "KERNELS..." [extra bench-engine args]
#   bench/compare.sh /tmp/qwen3-0.6b-q8_0.gguf 5 "auto reference" --threads 2
#
# Each round runs bench-engine once per kernel set with --repeat 1 --warmup 1 and --json; the
# prefill and decode tok/s of the rounds are collected and their medians printed.
set -euo pipefail
model=$1
rounds=$2
kernels=$3
shift 3
bin=${BENCH_ENGINE:-$(dirname "$0")/../build/bench-engine}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for ((r = 1; r <= rounds; r++)); do
  for k in $kernels; do
    "$bin" --model "$model" --kernels "$k" --repeat 1 --warmup 1 --json "$@" >>"$tmp/$k.jsonl"
  done
done
median() { sort -g | awk '{v[NR] = $1} END {if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
field() { sed -n "s/.*\"$1\": \\([0-9.]*\\).*/\\1/p" "$2"; }
printf '%-10s %8s %14s %14s %12s\n' kernels rounds "prefill tok/s" "decode tok/s" "peak RSS MiB"
for k in $kernels; do
  f=$tmp/$k.jsonl
  printf '%-10s %8d %14.1f %14.2f %12.0f\n' "$k" "$rounds" "$(field prefill_tok_s "$f" | median)" \
    "$(field decode_tok_s "$f" | median)" "$(field peak_rss_mib "$f" | median)"
done
