#!/usr/bin/env bash
# check_style.sh SOURCE_DIR — the parts of the style that must hold in every C and Lua source file
# (src include tools tests fuzz lib spec scripts bench): it opens with a comment saying what it owns,
# no line is longer than 120 columns (characters, .clang-format's ColumnLimit), and C function
# bodies open on the line of their signature (one brace style). The layout clang-format owns is
# checked by check_format.sh.
set -uo pipefail
src=$1
cd "$src" || exit 1
export LC_ALL=C.UTF-8 # columns are characters, not bytes
bad=0
fail() { echo "style: $*"; bad=$((bad + 1)); }

mapfile -t files < <(find src include tools tests fuzz lib spec scripts bench -type f \
  \( -name '*.c' -o -name '*.h' -o -name '*.lua' \) 2>/dev/null | sort)
[ ${#files[@]} -gt 0 ] || { echo "style: no source files under $src"; exit 1; }
for f in "${files[@]}"; do
  first=$(grep -m1 -v '^[[:space:]]*$' "$f")
  case $f in
    *.lua) [[ $first == --* ]] || fail "$f: does not open with a comment saying what it owns";;
    *)     [[ $first == /\** ]] || fail "$f: does not open with a comment saying what it owns";;
  esac
done
mapfile -t c_files < <(printf '%s\n' "${files[@]}" | grep '\.[ch]$')
# a line that is only "{" right after a line ending in ")": a function body opening on its own line
while IFS= read -r hit; do fail "$hit: function brace on its own line"; done < <(
  awk 'FNR == 1 { prev = "" } prev ~ /\)[[:space:]]*$/ && /^\{[[:space:]]*$/ { print FILENAME ":" FNR } { prev = $0 }' \
    "${c_files[@]}")
while IFS= read -r hit; do fail "$hit: line longer than 120 columns"; done < <(
  grep -nH '^.\{121,\}' "${files[@]}" | cut -d: -f1,2)

if [ $bad -gt 0 ]; then echo "$bad style problem(s)"; exit 1; fi
echo "style holds: every source file opens with what it owns; lines within 120 columns; one brace style"
