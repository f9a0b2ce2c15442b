#!/usr/bin/env bash
# check_style.sh SOURCE_DIR — the parts of the style (.clang-format) that must hold
# in every file: each C and Lua source file opens with a comment saying what it owns, and C function
# bodies open on the line of their signature (one brace style).
set -uo pipefail
src=$1
cd "$src" || exit 1
bad=0
fail() { echo "style: $*"; bad=$((bad + 1)); }

files=$(find src include tools tests lib spec scripts -type f \( -name '*.c' -o -name '*.h' -o -name '*.lua' \) | sort)
[ -n "$files" ] || { echo "style: no source files under $src"; exit 1; }
for f in $files; do
  first=$(grep -m1 -v '^[[:space:]]*$' "$f")
  case $f in
    *.lua) [[ $first == --* ]] || fail "$f: does not open with a comment saying what it owns";;
    *)     [[ $first == /\** ]] || fail "$f: does not open with a comment saying what it owns";;
  esac
  case $f in
    *.c|*.h)
      # a line that is only "{" right after a line ending in ")": a function body on its own line
      awk -v f="$f" 'prev ~ /\)[[:space:]]*$/ && $0 ~ /^\{[[:space:]]*$/ { printf "style: %s:%d: function brace on its own line\n", f, NR; n++ }
                     { prev = $0 } END { exit n > 0 }' "$f" || bad=$((bad + 1));;
  esac
done

if [ $bad -gt 0 ]; then echo "$bad style problem(s)"; exit 1; fi
echo "style holds: every source file opens with what it owns; one brace style"
