#!/bin/sh
# install_test.sh — ember installed into a temporary prefix runs from anywhere: `cmake --install`,
# the prefix copied elsewhere, and from / with HOME, XDG_CACHE_HOME and TMPDIR pointing at fresh
# directories (EMBER_LIB, LUA_PATH, LUA_CPATH unset), the workflow with no flags must report the
# criterion holding and make the default model in $XDG_CACHE_HOME/ember. Removes what it made.
#
# usage: install_test.sh BUILD_DIR SOURCE_DIR [SANITIZE]   (ctest passes them; SANITIZE is ON in
# an ASan/UBSan build, whose instrumentation records full source paths: the path check is skipped)
set -u
build=$1
src=$2
sanitize=${3:-OFF}
fail() { echo "install_test: FAIL: $*" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/ember-install-test.XXXXXX") || fail "mktemp"
trap 'rm -rf "$work"' EXIT INT TERM
if ! "${CMAKE:-cmake}" --install "$build" --prefix "$work/prefix" >"$work/install.log" 2>&1; then
  cat "$work/install.log" >&2
  fail "cmake --install"
fi

# Run from a copy, so nothing can reach back into the install location either.
cp -R "$work/prefix" "$work/moved" || fail "copy of the prefix"
P=$work/moved
for f in bin/ember-lua bin/ember bin/bench-engine bin/make-tiny-model lib/lua/5.4/ember/core.so share/ember/scripts/workflows/capture_patch_restore.lua \
         share/ember/scripts/experiments/activation_stats.lua share/lua/5.4/ember/cli.lua; do
  [ -e "$P/$f" ] || fail "$f is not installed"
done

# The Slurm launchers: every scripts/slurm/*.sh installed executable (in the prefix and its copy).
for f in "$src"/scripts/slurm/*.sh; do
  [ -e "$f" ] || fail "no scripts/slurm/*.sh in the source tree '$src'"
  for p in "$work/prefix" "$P"; do
    i=$p/share/ember/scripts/slurm/$(basename "$f")
    [ -f "$i" ] || fail "share/ember/scripts/slurm/$(basename "$f") is not installed"
    [ -x "$i" ] || fail "share/ember/scripts/slurm/$(basename "$f") is installed without execute permission"
  done
done

# No absolute path of the source tree or the build directory is compiled into the binaries.
if [ "$sanitize" = ON ]; then
  echo "install_test: sanitizer build: not checking the binaries for source paths (ASan/UBSan record them)"
else
  for bin in "$P/bin/ember-lua" "$P/lib/lua/5.4/ember/core.so" "$P/bin/bench-engine" "$P/bin/make-tiny-model"; do
    for dir in "$src" "$(cd "$build" && pwd)"; do
      if grep -q -F -- "$dir" "$bin"; then fail "$bin contains the path '$dir'"; fi
    done
  done
fi

mkdir -p "$work/home" "$work/cache" "$work/tmp"
run() { # run CMD... from / with a clean environment
  (cd / && env -u EMBER_LIB -u EMBER_BENCH_ENGINE -u LUA_PATH -u LUA_CPATH -u LUA_PATH_5_4 -u LUA_CPATH_5_4 -u EMBER_LUA \
     HOME="$work/home" XDG_CACHE_HOME="$work/cache" TMPDIR="$work/tmp" "$@")
}

# The workflow, with no flags. Under strace (when the machine has it and allows it) every file the
# run touches is recorded, and none may lie in the source tree or the build directory (not in a
# sanitizer build: LeakSanitizer refuses to run under ptrace).
trace=
if [ "$sanitize" != ON ] && command -v strace >/dev/null 2>&1 && strace -f -qq -o /dev/null true 2>/dev/null; then
  trace=$work/trace.txt
  out=$(run strace -f -qq -e trace=%file -o "$trace" "$P/bin/ember-lua" \
        "$P/share/ember/scripts/workflows/capture_patch_restore.lua" 2>&1)
else
  echo "install_test: strace not available (or a sanitizer build): not tracing which files the run opens"
  out=$(run "$P/bin/ember-lua" "$P/share/ember/scripts/workflows/capture_patch_restore.lua" 2>&1)
fi
rc=$?
echo "$out"
if [ -n "$trace" ]; then
  [ -s "$trace" ] || fail "strace wrote no trace"
  for dir in "$src" "$(cd "$build" && pwd)"; do
    if grep -F -- "\"$dir" "$trace" >&2; then fail "the installed ember touched files under '$dir'"; fi
  done
fi
[ $rc -eq 0 ] || fail "the workflow exited with $rc"
echo "$out" | grep -q "^restoration criterion: HOLDS$" || fail "the workflow did not report the criterion holding"
[ -s "$work/cache/ember/tiny-llama-q8_0.gguf" ] || fail "no default model in \$XDG_CACHE_HOME/ember"
[ ! -e "$work/home/.cache" ] || fail "the default model went to ~/.cache although XDG_CACHE_HOME is set"
# the generator run by ember-lua writes the same bytes as the installed make-tiny-model
run "$P/bin/make-tiny-model" --family llama --dtype q8_0 --seed 7 --out "$work/expected.gguf" ||
  fail "the installed make-tiny-model"
cmp -s "$work/expected.gguf" "$work/cache/ember/tiny-llama-q8_0.gguf" ||
  fail "the default model differs from make-tiny-model --family llama --dtype q8_0 --seed 7"

# `ember benchmark --membw` finds its probe, the installed bench-engine beside the interpreter: it
# looks before loading the model, so a missing model file is the error it reports (no benchmark
# runs). The probe itself starts from there (its usage line, given no model).
run "$P/bin/bench-engine" >/dev/null 2>"$work/err"
grep -q "^usage: bench-engine" "$work/err" || { cat "$work/err" >&2; fail "the installed bench-engine does not run"; }
run "$P/bin/ember" benchmark --membw --model "$work/tmp/missing.gguf" >/dev/null 2>"$work/err" &&
  fail "ember benchmark with a missing model succeeded"
if grep -q "bandwidth probe" "$work/err"; then cat "$work/err" >&2; fail "the installed ember benchmark --membw did not find bench-engine"; fi
grep -q "missing.gguf" "$work/err" || { cat "$work/err" >&2; fail "ember benchmark did not name the missing model"; }

# The launcher finds the ember-lua beside it; an experiment file of share/ember/scripts runs.
v=$(run "$P/bin/ember" --version) || fail "bin/ember --version"
want="ember $(run "$P/bin/ember-lua" -e 'io.write(require("ember").version)')"
[ "$v" = "$want" ] || fail "bin/ember --version said '$v'"
mkdir -p "$work/links" && ln -s "$P/bin/ember" "$work/links/ember" || fail "ln -s"
[ "$(run "$work/links/ember" --version)" = "$v" ] || fail "bin/ember called through a symbolic link"
run "$P/bin/ember" --model "$work/cache/ember/tiny-llama-q8_0.gguf" --prompt "Hello" --max-tokens 2 \
  --experiment "$P/share/ember/scripts/experiments/zero_layer_output.lua" --experiment-args 1:mlp \
  --run-manifest "$work/tmp/run.json" >/dev/null 2>"$work/err" || { cat "$work/err" >&2; fail "ember --experiment"; }
grep -q "MODIFIED by experiment 'zero-layer-output'" "$work/err" || fail "the experiment file did not run"

# The installed job-array launcher runs as a program and, with EMBER unset, has its tasks run the
# prefix's own bin/ember (an sbatch stand-in records the submission instead of a cluster: the
# command reaches the job scripts as an argument, after the script's path).
mkdir -p "$work/fakebin"
printf '#!/bin/sh\nprintf "%%s\\n" "$@" >>"%s"\necho 4242\n' "$work/sbatch-args" >"$work/fakebin/sbatch" &&
  chmod +x "$work/fakebin/sbatch" || fail "fake sbatch"
run env -u EMBER PATH="$work/fakebin:$PATH" "$P/share/ember/scripts/slurm/sweep_array.sh" --shards 2 \
  --out "$work/tmp/sw" -- --model m.gguf >/dev/null 2>"$work/err" || { cat "$work/err" >&2; fail "installed sweep_array.sh"; }
grep -A1 -x "$work/tmp/sw.shards/task.sh" "$work/sbatch-args" | grep -qx "$P/bin/ember" ||
  fail "the installed sweep_array.sh does not run the prefix's bin/ember: $(cat "$work/sbatch-args")"

# Stock lua5.4 with the installed core module and library files (an ASan core.so cannot be loaded
# into an uninstrumented interpreter).
if [ "$sanitize" = ON ]; then
  echo "install_test: sanitizer build: not loading core.so into stock lua5.4"
elif command -v lua5.4 >/dev/null 2>&1; then
  got=$(run env LUA_PATH="$P/share/lua/5.4/?.lua;$P/share/lua/5.4/?/init.lua;;" LUA_CPATH="$P/lib/lua/5.4/?.so;;" \
        lua5.4 -e 'io.write(require("ember").version)') || fail "lua5.4 with the installed module"
  [ "ember $got" = "$v" ] || fail "lua5.4 saw version '$got'"
fi
echo "install_test: ok"
