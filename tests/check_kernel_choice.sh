#!/usr/bin/env bash
# check_kernel_choice.sh BUILD_DIR — on simulated CPU feature sets (EMBER_CPU_FEATURES, which can
# only take features away), ember.cpu().kernels, what `auto` loads, the set the `ember` command
# reports, and which --kernels values it accepts must all agree with the hand-written best set;
# a bad EMBER_KERNELS must be an error naming the variable in the library and the CLI.
set -uo pipefail
build=$1
lua=$build/ember-lua ember=$build/ember
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
model=$tmp/tiny.gguf
"$build/make-tiny-model" --family llama --dtype q8_0 --seed 7 --out "$model" >/dev/null || { echo "cannot make a model"; exit 1; }
fails=0 checks=0
check() { # check COND-RESULT MESSAGE
  checks=$((checks + 1))
  if [ "$1" != 0 ]; then fails=$((fails + 1)); echo "FAIL: $2"; fi
}

# What this CPU really has: a simulated set can only be a subset of it.
real=$("$lua" -e 'local c = require("ember").cpu(); local t = {}
  for _, k in ipairs({"avx2","fma","f16c","avx512f","avx512bw","avx512vl","avx512vnni","avx512bf16"}) do
    if c[k] then t[#t+1] = k end end; io.write(table.concat(t, ","))')

rank() { case $1 in reference) echo 0;; avx2) echo 1;; avx512) echo 2;; esac; }
ran=0
# label | features | best set (from the sets' compile flags: avx2 = avx2+fma+f16c, avx512 = that + f/bw/vl/vnni)
while IFS='|' read -r label feats best; do
  missing=""
  for f in ${feats//,/ }; do [ "$f" = none ] && continue; [[ ",$real," == *",$f,"* ]] || missing="$missing $f"; done
  if [ -n "$missing" ]; then echo "skip '$label': this CPU lacks$missing"; continue; fi
  ran=$((ran + 1))
  export EMBER_CPU_FEATURES=$feats
  cpu=$("$lua" -e 'io.write(require("ember").cpu().kernels)')
  [ "$cpu" = "$best" ]; check $? "$label: ember.cpu().kernels = '$cpu', expected '$best'"
  auto=$("$lua" -e "local m = require('ember').load{ model = '$model', threads = 1 }; io.write(m.info.kernels)" 2>&1)
  [ "$auto" = "$best" ]; check $? "$label: auto loads '$auto', expected '$best'"
  cli=$("$ember" benchmark --model "$model" --prompt-tokens 2 --gen-tokens 1 --repeat 1 --warmup 0 --threads 1 2>&1 |
        sed -n 's/^kernels *\([a-z0-9]*\),.*/\1/p')
  [ "$cli" = "$best" ]; check $? "$label: ember benchmark reports '$cli', expected '$best'"
  for set in reference avx2 avx512; do
    out=$("$ember" --model "$model" --prompt hi --max-tokens 1 --threads 1 --kernels "$set" 2>&1); rc=$?
    if [ "$(rank "$set")" -le "$(rank "$best")" ]; then
      [ $rc = 0 ]; check $? "$label: --kernels $set must run (rc $rc: $out)"
    else
      [ $rc != 0 ] && [[ $out == *"lacks"* ]]; check $? "$label: --kernels $set must be refused naming what is missing (rc $rc: $out)"
    fi
  done
  unset EMBER_CPU_FEATURES
done <<'TABLE'
none|none|reference
avx2 without fma|avx2,f16c|reference
avx2+fma+f16c|avx2,fma,f16c|avx2
avx512 without vnni|avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512bf16|avx2
full avx512|avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512bf16|avx512
TABLE

out=$(EMBER_KERNELS=fastest "$lua" -e "require('ember').load{ model = '$model' }" 2>&1); rc=$?
[ $rc != 0 ] && [[ $out == *EMBER_KERNELS* ]]; check $? "bad EMBER_KERNELS in the library: rc $rc: $out"
out=$(EMBER_KERNELS=fastest "$ember" --model "$model" --prompt hi --max-tokens 1 2>&1); rc=$?
[ $rc != 0 ] && [[ $out == *EMBER_KERNELS* ]]; check $? "bad EMBER_KERNELS in the CLI: rc $rc: $out"

echo "$((checks - fails)) passed, $fails failed ($ran of 5 CPU feature sets simulated)"
[ $fails = 0 ] || exit 1
[ $ran -gt 0 ] || exit 77
