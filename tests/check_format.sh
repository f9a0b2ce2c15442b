#!/usr/bin/env bash
# check_format.sh SOURCE_DIR — every C and header file outside vendor/ is laid out as .clang-format
# says: `clang-format --dry-run -Werror` over them all (it reports, it never rewrites a file).
set -uo pipefail
src=$1
cd "$src" || exit 1
command -v clang-format >/dev/null || { echo "skipped: clang-format is not installed (run.sh installs it)"; exit 77; }
# The tree is formatted with Debian 12's clang-format 14; another major version lays some lines out
# differently, so its verdict would be about the version, not the tree.
version=$(clang-format --version | grep -oE 'version [0-9]+' | grep -oE '[0-9]+')
[ "$version" = 14 ] || { echo "skipped: clang-format $version is not 14, the version the tree is formatted with"; exit 77; }
[ -f .clang-format ] || { echo "format: $src/.clang-format is missing"; exit 1; }
mapfile -t files < <(find src include tools tests fuzz bench -type f \( -name '*.c' -o -name '*.h' \) 2>/dev/null | sort)
[ ${#files[@]} -gt 0 ] || { echo "format: no C files under $src"; exit 1; }
if ! out=$(clang-format --style=file:.clang-format --dry-run -Werror "${files[@]}" 2>&1); then
  printf '%s\n' "$out" | head -40
  n=$(printf '%s\n' "$out" | grep -cE '^[^ ]+:[0-9]+:[0-9]+: error:')
  echo "format: $n line(s) not as .clang-format lays them out (clang-format -i FILE rewrites them)"
  exit 1
fi
echo "format holds: ${#files[@]} C files as .clang-format lays them out"
