#!/usr/bin/env bash
# bench/vs_llamacpp.sh — ember and llama.cpp side by side: the same GGUF files, the same thread
# count, interleaved rounds, medians and ratios per (prompt, generated) length and KV cache setting.
#
#   bench/vs_llamacpp.sh MODEL.gguf [MODEL.gguf ...]
#
# Settings (environment):
#   LLAMA_BENCH   llama-bench binary (default ../shared/bench/llama.cpp/llama-bench beside the tree)
#   LENGTHS       "P/G ..." prompt / generated token counts (default "52/32 512/128 2048/128 4096/64")
#   ROUNDS        interleaved rounds (default 3); each round runs every cell once per engine,
#                 the engine that goes first alternating from round to round
#   KV            KV cache settings to compare (default "default"):
#                   default  each engine's default: ember f32, llama.cpp f16 (what a user gets)
#                   f16      f16 on both sides (ember --kv-cache f16, llama.cpp -ctk f16 -ctv f16)
#                   bf16     bf16 on both sides
#                 e.g. KV="default f16"
#   THREADS       thread counts, each run by both engines (default "2"; e.g. "1 2")
#   WARMUP        1 (default): each measurement is preceded by an unreported run (bench-engine
#                 --warmup 1; llama-bench's own warm-up); 0: none on either side
#   LLAMA_CPU     llama.cpp CPU variant to use (e.g. zen4, icelake, haswell); default: the one
#                 llama.cpp picks, or, if that one dies of an illegal instruction (a CPU that
#                 advertises AMX a VM does not enable, say), the best of the others that runs for
#                 this CPU's vendor. A library built for the other vendor's CPUs (zen4 on an Intel
#                 CPU; skylakex, cascadelake, icelake, alderlake, sapphirerapids on an AMD one) is
#                 refused unless LLAMA_CPU names it: its figures would not be llama.cpp's on this
#                 machine. haswell, sse42 and x64 are generic x86 levels, used on either vendor.
#   LLAMA_ARGS    extra llama-bench arguments (default "-lm none": weights read in and repacked,
#                 its fastest mode; both engines then compute from memory, not the mapping)
#   EMBER_BUILD   ember's build directory (default build/ in the tree)
#   OUT           also write the results here: OUT.jsonl (every measurement), OUT.json (summary)
#                 and OUT.md (the dated table with the machine, as docs/performance.md quotes it)
#   PROVENANCE    1: also run `ember benchmark --provenance-ab` per model (first-token time of an
#                 experiment run against a plain run; docs/artifacts.md#the-model-digest)
#
# What is measured, on each side:
#   prefill  P tokens from an empty cache: bench-engine's prefill; llama-bench -p P -n 0
#   decode   G tokens right after a P-token prefill, i.e. at depth P: bench-engine's decode (it
#            decodes after its prefill); llama-bench -p 0 -n G -d P (without -d llama-bench decodes
#            from an empty cache, which flatters it at long contexts)
# The machines this runs on are often shared: the ranges (min-max over rounds) are printed with the
# medians, and the header records the CPU, its features, llama.cpp's library and the load average
# before and after. After each round the elapsed time and the projected end are printed.
# bench/vs_llamacpp_goal.sh runs every cell of the issue-31 goal (models made as performance.md says).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${EMBER_BUILD:-$root/build}
bench_engine=$build/bench-engine
llama_bench=${LLAMA_BENCH:-$root/../shared/bench/llama.cpp/llama-bench}
lengths=${LENGTHS:-"52/32 512/128 2048/128 4096/64"}
rounds=${ROUNDS:-3}
kvs=${KV:-default}
threads_list=${THREADS:-2}
warmup=${WARMUP:-1}
llama_args=${LLAMA_ARGS:--lm none}

die() { echo "vs_llamacpp: $*" >&2; exit 2; }
[ $# -ge 1 ] || die "usage: bench/vs_llamacpp.sh MODEL.gguf [MODEL.gguf ...] (settings: see the top of this file)"
for m in "$@"; do [ -r "$m" ] || die "cannot read model '$m'"; done
[ -x "$bench_engine" ] || die "missing $bench_engine (cmake --build build)"
[ -x "$llama_bench" ] || die "missing llama-bench '$llama_bench' (set LLAMA_BENCH=...)"
command -v lua5.4 >/dev/null || die "lua5.4 (with lua-cjson) is needed to summarise"
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || die "ROUNDS must be a positive integer (got '$rounds')"
for th in $threads_list; do [[ "$th" =~ ^[1-9][0-9]*$ ]] || die "THREADS: '$th' is not a positive integer"; done
threads=${threads_list%% *}
[[ "$warmup" =~ ^[01]$ ]] || die "WARMUP must be 0 or 1 (got '$warmup')"
for pg in $lengths; do [[ "$pg" =~ ^[1-9][0-9]*/[1-9][0-9]*$ ]] || die "LENGTHS: '$pg' is not P/G"; done
for kv in $kvs; do
  case $kv in default | f16 | bf16) ;; *) die "KV: unknown setting '$kv' (default, f16, bf16)" ;; esac
done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
results=$tmp/results.jsonl

# ---- llama.cpp's CPU variant -------------------------------------------------------------------
# A private copy of the folder with one CPU library makes llama.cpp use that variant (it loads the
# best libggml-cpu-*.so found beside the binary).
llama_dir=$(dirname "$llama_bench")
use_variant() {
  local v=$1 d=$tmp/llama-$1
  [ -f "$llama_dir/libggml-cpu-$v.so" ] || return 1
  mkdir -p "$d"
  for f in "$llama_dir"/*; do
    case $(basename "$f") in libggml-cpu-*) ;; *) cp "$f" "$d/" ;; esac
  done
  cp "$llama_dir/libggml-cpu-$v.so" "$d/"
  llama_bench=$d/$(basename "$llama_bench")
  llama_variant=$v
}
llama_runs() { # a 64-token prefill (batched kernels) on the first model: does this llama-bench run here?
  # in a subshell, so that the shell's own "Illegal instruction" notice goes to /dev/null too
  ("$llama_bench" -m "$1" -t "$threads" -p 64 -n 0 -r 1 --no-warmup $llama_args -o json >/dev/null 2>&1) 2>/dev/null
}
vendor=$(sed -n 's/^vendor_id[[:space:]]*: //p' /proc/cpuinfo | head -1)
variant_vendor() { # the CPU vendor a llama.cpp variant is built for ('' = a generic x86 level)
  case $1 in
    zen4) echo AuthenticAMD ;;
    skylakex | cascadelake | icelake | alderlake | sapphirerapids) echo GenuineIntel ;;
    *) echo "" ;;
  esac
}
loaded_variant() { # the CPU library llama-bench loads by itself (its own choice)
  "$llama_bench" -m "$1" -t "$threads" -p 8 -n 0 -r 1 --no-warmup $llama_args -o json 2>&1 >/dev/null |
    sed -n 's/.*loaded CPU backend from .*libggml-cpu-\([a-z0-9_]*\)\.so.*/\1/p' | head -1
}
llama_variant=
rc=0
if [ -n "${LLAMA_CPU:-}" ]; then
  use_variant "$LLAMA_CPU" || die "LLAMA_CPU: no libggml-cpu-$LLAMA_CPU.so in $llama_dir"
else
  llama_runs "$1" || rc=$?
  [ "$rc" -ne 0 ] || llama_variant=$(loaded_variant "$1")
  [ -n "$llama_variant" ] || [ "$rc" -ne 0 ] || llama_variant="(llama.cpp's choice, not named in its log)"
fi
if [ "$rc" -ne 0 ]; then
  found=
  for v in zen4 sapphirerapids icelake cascadelake skylakex alderlake haswell sse42 x64; do
    vv=$(variant_vendor "$v")
    [ -z "$vv" ] || [ "$vv" = "$vendor" ] || continue
    if use_variant "$v" && llama_runs "$1"; then found=$v; break; fi
  done
  [ -n "$found" ] || die "llama-bench fails on '$1' (exit $rc) with every CPU variant for a $vendor CPU"
  echo "vs_llamacpp: llama.cpp's own choice of CPU library failed here (exit $rc); using '$found'" >&2
fi
vv=$(variant_vendor "$llama_variant")
if [ -n "$vv" ] && [ "$vv" != "$vendor" ] && [ -z "${LLAMA_CPU:-}" ]; then
  die "llama.cpp loads libggml-cpu-$llama_variant.so, built for $vv CPUs, on this $vendor CPU: its figures would not be llama.cpp's here (set LLAMA_CPU=$llama_variant to measure it anyway, or LLAMA_CPU=haswell)"
fi

# ---- one measurement per engine ----------------------------------------------------------------
record() { # engine model P G kv round prefill decode (threads: $threads)
  printf '{"engine":"%s","model":"%s","prompt":%d,"gen":%d,"kv":"%s","round":%d,"threads":%d,"prefill_tok_s":%s,"decode_tok_s":%s}\n' \
    "$1" "$2" "$3" "$4" "$5" "$6" "$threads" "$7" "$8" >>"$results"
}
num() { sed -n "s/.*\"$1\": *\\([0-9.eE+-]*\\).*/\\1/p" | head -1; }

run_ember() { # model P G kv round
  local kvflag=()
  [ "$4" = default ] || kvflag=(--kv-cache "$4")
  local out
  if ! out=$("$bench_engine" --model "$1" --prompt-tokens "$2" --gen-tokens "$3" --threads "$threads" \
    --repeat 1 --warmup "$warmup" --json "${kvflag[@]}" 2>"$tmp/err"); then
    die "bench-engine failed on $1 ($2/$3, kv $4): $(head -c 400 "$tmp/err")"
  fi
  record ember "$1" "$2" "$3" "$4" "$5" "$(num prefill_tok_s <<<"$out")" "$(num decode_tok_s <<<"$out")"
}

llama_ts() { # args... -> avg_ts of the one test
  local out
  local warm=()
  [ "$warmup" = 1 ] || warm=(--no-warmup)
  if ! out=$("$llama_bench" -t "$threads" -r 1 "${warm[@]}" $llama_args -o json "$@" 2>"$tmp/err"); then
    die "llama-bench $* failed: $(tail -c 400 "$tmp/err")"
  fi
  num avg_ts <<<"$out"
}

run_llama() { # model P G kv round
  local kvflag=()
  [ "$4" = default ] || kvflag=(-ctk "$4" -ctv "$4")
  local pre dec
  pre=$(llama_ts -m "$1" -p "$2" -n 0 "${kvflag[@]}")
  dec=$(llama_ts -m "$1" -p 0 -n "$3" -d "$2" "${kvflag[@]}")
  record llama.cpp "$1" "$2" "$3" "$4" "$5" "$pre" "$dec"
}

# ---- the header: what machine, what state ------------------------------------------------------
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
flags=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|f16c|avx512f|avx512bw|avx512vl|avx512_vnni|avx_vnni|avx512_bf16|amx_tile)$' | tr '\n' ' ')
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
ember_kernels=$("$bench_engine" --model "$1" --prompt-tokens 1 --gen-tokens 0 --repeat 1 --warmup 0 --json \
  --threads "$threads" 2>/dev/null | sed -n 's/.*"kernels": "\([a-z0-9]*\)".*/\1/p')
started=$(date -u '+%Y-%m-%d %H:%M UTC')
header=$tmp/header.txt
{
  echo "# ember vs llama.cpp: $started, $(nproc) cores, threads $threads_list (each engine)"
  echo "# CPU: $cpu ($vendor); features: $flags"
  echo "# ember kernels: ${ember_kernels:-?}; llama.cpp CPU library: libggml-cpu-$llama_variant.so; llama-bench $llama_args"
  echo "# $rounds interleaved rounds; lengths $lengths; KV: $kvs; load average before: $load_before"
} | tee "$header"

# ---- the rounds --------------------------------------------------------------------------------
t_start=$(date +%s)
for ((r = 1; r <= rounds; r++)); do
  for m in "$@"; do
    for threads in $threads_list; do
      for pg in $lengths; do
        p=${pg%/*} g=${pg#*/}
        for kv in $kvs; do
          if ((r % 2)); then
            run_ember "$m" "$p" "$g" "$kv" "$r"; run_llama "$m" "$p" "$g" "$kv" "$r"
          else
            run_llama "$m" "$p" "$g" "$kv" "$r"; run_ember "$m" "$p" "$g" "$kv" "$r"
          fi
        done
      done
    done
  done
  el=$(($(date +%s) - t_start))
  echo "# round $r of $rounds done ($(date -u +%H:%M:%S), load $(cut -d' ' -f1 /proc/loadavg)); elapsed $((el / 60)) min, projected end in $((el * (rounds - r) / r / 60)) min" >&2
done
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$header"

# ---- medians and ratios ------------------------------------------------------------------------
summary=$tmp/summary.json
lua5.4 - "$results" "$summary" <<'LUA' | tee "$tmp/table.md"
local cjson = require("cjson")
local results, summary_path = arg[1], arg[2]
local function median(t)
  local s = {}
  for i, v in ipairs(t) do s[i] = v end
  table.sort(s)
  local n = #s
  if n == 0 then return nil end
  return n % 2 == 1 and s[(n + 1) // 2] or (s[n // 2] + s[n // 2 + 1]) / 2
end
local cells, order = {}, {}
for line in io.lines(results) do
  local r = cjson.decode(line)
  local key = table.concat({ r.model, r.threads, r.prompt, r.gen, r.kv }, "|")
  local c = cells[key]
  if not c then
    c = { model = r.model, threads = r.threads, prompt = r.prompt, gen = r.gen, kv = r.kv,
      ember = { prefill = {}, decode = {} },
      ["llama.cpp"] = { prefill = {}, decode = {} } }
    cells[key] = c
    order[#order + 1] = key
  end
  local side = c[r.engine]
  side.prefill[#side.prefill + 1] = r.prefill_tok_s
  side.decode[#side.decode + 1] = r.decode_tok_s
end
local function range(t)
  local lo, hi = math.huge, -math.huge
  for _, v in ipairs(t) do lo = math.min(lo, v); hi = math.max(hi, v) end
  return lo, hi
end
local KV = { default = "f32 / f16", f16 = "f16 / f16", bf16 = "bf16 / bf16" }
print("")
print("| model | threads | prompt / gen | KV ember / llama.cpp | ember prefill | llama.cpp prefill | ratio | ember decode | llama.cpp decode | ratio |")
print("|---|---|---|---|---|---|---|---|---|---|")
local out = { cells = {} }
for _, key in ipairs(order) do
  local c = cells[key]
  local e, l = c.ember, c["llama.cpp"]
  local ep, lp, ed, ld = median(e.prefill), median(l.prefill), median(e.decode), median(l.decode)
  local function cell(med, t, fmt)
    local lo, hi = range(t)
    return string.format(fmt .. " (" .. fmt .. "-" .. fmt .. ")", med, lo, hi)
  end
  print(string.format("| %s | %d | %d / %d | %s | %s | %s | **%.2fx** | %s | %s | **%.2fx** |", c.model:match("[^/]*$"),
    c.threads, c.prompt, c.gen, KV[c.kv], cell(ep, e.prefill, "%.1f"), cell(lp, l.prefill, "%.1f"), ep / lp,
    cell(ed, e.decode, "%.2f"), cell(ld, l.decode, "%.2f"), ed / ld))
  out.cells[#out.cells + 1] = { model = c.model, threads = c.threads, prompt = c.prompt, gen = c.gen, kv = c.kv,
    ember = { prefill_tok_s = ep, decode_tok_s = ed, prefill_runs = e.prefill, decode_runs = e.decode },
    llamacpp = { prefill_tok_s = lp, decode_tok_s = ld, prefill_runs = l.prefill, decode_runs = l.decode },
    prefill_ratio = ep / lp, decode_ratio = ed / ld }
end
print("")
print("(medians over the rounds, min-max in parentheses, tok/s; ratio = ember / llama.cpp)")
local f = assert(io.open(summary_path, "w"))
f:write(cjson.encode(out))
f:close()
LUA

if [ -n "${OUT:-}" ]; then
  cp "$results" "$OUT.jsonl"
  cp "$summary" "$OUT.json"
  { sed 's/^# //' "$header"; cat "$tmp/table.md"; } >"$OUT.md.tmp" && mv "$OUT.md.tmp" "$OUT.md"
  echo "# every measurement: $OUT.jsonl; summary: $OUT.json; table for docs/performance.md: $OUT.md"
else
  echo "# summary (JSON):"
  cat "$summary"
  echo
fi

if [ "${PROVENANCE:-0}" = 1 ]; then
  for m in "$@"; do
    echo "# ember benchmark --provenance-ab on $m"
    "$build/ember" benchmark --model "$m" --provenance-ab --threads "$threads" --repeat "$((rounds * 2 + 1))" \
      --gen-tokens 8
  done
fi
