#!/usr/bin/env bash
# check_kernel_flags.sh SOURCE_DIR BUILD_DIR — each SIMD kernel set is compiled for exactly the CPU
# features it requires at run time: the -m<feature> flags CMakeLists.txt gives src/kernels/<set>.c
# against the set's row of the kernel-set table (dispatch.c, read through ember.KERNEL_SETS). A flag
# the runtime check does not require would let the compiler emit instructions a CPU that passes the
# check lacks; a requirement without its flag refuses CPUs for nothing.
set -uo pipefail
src=$1 build=$2
lua=$build/ember-lua
[ -x "$lua" ] || { echo "missing $lua (build the project first)"; exit 77; }
fails=0 sets=0
while read -r set requires; do
  [ "$set" = auto ] || [ "$set" = reference ] && continue
  sets=$((sets + 1))
  line=$(grep -A1 "src/kernels/$set.c PROPERTIES" "$src/CMakeLists.txt" | grep -o 'COMPILE_OPTIONS "[^"]*"')
  flags=$(echo "$line" | sed 's/COMPILE_OPTIONS "//; s/"$//' | tr ';' '\n' | sed -n 's/^-m//p' | sort | tr '\n' ' ')
  want=$(echo "$requires" | tr ' ' '\n' | sort | tr '\n' ' ')
  if [ -z "$line" ]; then
    echo "FAIL: no COMPILE_OPTIONS for src/kernels/$set.c in CMakeLists.txt"; fails=$((fails + 1))
  elif [ "$flags" != "$want" ]; then
    echo "FAIL: $set.c is built with -m: $flags; the set requires: $want"; fails=$((fails + 1))
  else
    echo "ok: $set.c: $flags"
  fi
done < <("$lua" -e 'for _, s in ipairs(require("ember.core").KERNEL_SETS) do
  print(s.name .. " " .. table.concat(s.requires, " ")) end')
[ "$sets" -ge 1 ] || { echo "FAIL: no SIMD kernel set listed"; exit 1; }
[ "$fails" = 0 ] || exit 1
echo "kernel flags: $sets sets agree with their runtime requirements"
