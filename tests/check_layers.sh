#!/usr/bin/env bash
# check_layers.sh SOURCE_DIR — the include arrows of docs/architecture.md, checked by grep:
#   src/kernels       includes only its own headers (and system headers); calls nothing above
#   src/engine        includes no Lua header and nothing of the bindings
#   src/lua_bindings  includes its own headers, ember.h and the one named internal header
#                     (include/ember_internal.h), never another engine or kernels header; from the
#                     tools only tiny_model.h (ember.make_tiny_model runs the generator)
set -uo pipefail
src=$1
bad=0
fail() { echo "layer violation: $*"; bad=$((bad + 1)); }

# quoted and angle includes of a file: "path:line:name"
includes() { grep -HnoE '^[[:space:]]*#[[:space:]]*include[[:space:]]*["<][^">]+[">]' "$@" |
             sed -E 's/#[[:space:]]*include[[:space:]]*//; s/[[:space:]]+//g'; }
lua_header='[<"](lua|lauxlib|lualib|luaconf)\.h[>"]'

for f in "$src"/src/kernels/*.[ch]; do
  while IFS= read -r inc; do
    name=${inc##*:}
    case $name in
      \<*) [[ $name =~ $lua_header ]] && fail "$inc: a kernel file includes Lua";;
      \"*) h=${name//\"/}; [ -f "$src/src/kernels/$h" ] || fail "$inc: a kernel file includes '$h', which is not a kernels header";;
    esac
  done < <(includes "$f")
done
# calls into the engine (its error formatter, hooks, models, sessions) or Lua
up=$(grep -lE '\bember_error_set\(|\bember_hook_call\(|\bember_model_[a-z_]*\(|\bember_session_[a-z_]*\(|\blua_[a-z]*\(' \
     "$src"/src/kernels/*.[ch])
[ -z "$up" ] || fail "kernel files call engine or Lua functions:" $up

for f in "$src"/src/engine/*.[ch]; do
  while IFS= read -r inc; do
    name=${inc##*:}
    [[ $name =~ $lua_header ]] && fail "$inc: an engine file includes Lua"
    h=${name//[\"<>]/}
    [ -f "$src/src/lua_bindings/$h" ] && fail "$inc: an engine file includes the bindings' '$h'"
  done < <(includes "$f")
done

for f in "$src"/src/lua_bindings/*.[ch]; do
  while IFS= read -r inc; do
    name=${inc##*:}
    case $name in
      \"*) h=${name//\"/}
           case $h in
             ember.h|ember_internal.h|tiny_model.h) ;;
             *) [ -f "$src/src/lua_bindings/$h" ] ||
                  fail "$inc: a binding includes '$h'; bindings use ember.h, ember_internal.h (and tiny_model.h) only";;
           esac;;
    esac
  done < <(includes "$f")
done

if [ $bad -gt 0 ]; then echo "$bad layer violation(s)"; exit 1; fi
echo "layers hold: kernels <- engine <- bindings (include/ember_internal.h the one internal header)"
