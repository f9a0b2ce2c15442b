#!/usr/bin/env bash
# check_style.sh SOURCE_DIR — the parts of the style (.clang-format) that must hold
# in every file: each C and Lua source file opens with a comment saying what it owns, and C function
# bodies open on the line of their signature (one brace style), except in the files listed below.
set -uo pipefail
src=$1
cd "$src" || exit 1
bad=0
fail() { echo "style: $*"; bad=$((bad + 1)); }

# Files still written with the opening brace of a function on its own line, converted when no other
# change is in flight on them (the tokenizer's files).
brace_pending=" src/tokenizer/ src/engine/tokenizer_gguf.c src/lua_bindings/l_tokenizer.c "

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
      pending=0
      for p in $brace_pending; do [[ $f == "$p"* ]] && pending=1; done
      # a line that is only "{" right after a line ending in ")": a function body on its own line
      if [ $pending -eq 0 ]; then
        awk -v f="$f" 'prev ~ /\)[[:space:]]*$/ && $0 ~ /^\{[[:space:]]*$/ { printf "style: %s:%d: function brace on its own line\n", f, NR; n++ }
                       { prev = $0 } END { exit n > 0 }' "$f" || bad=$((bad + 1))
      fi;;
  esac
done

if [ $bad -gt 0 ]; then echo "$bad style problem(s)"; exit 1; fi
echo "style holds: every source file opens with what it owns; one brace style"
