#!/usr/bin/env bash
# check_layers.sh SOURCE_DIR — the include arrows of docs/architecture.md, checked by grep:
#   src/kernels       includes only its own headers (and system headers); calls nothing above
#   src/tokenizer     includes its own headers and the kernels' (types.h), no Lua, nothing of the
#                     engine (GGUF vocabularies are read by the engine: engine -> tokenizer)
#   src/engine        includes no Lua header, nothing of the bindings, and of the tokenizer only
#                     its public tokenizer.h
#   everywhere        the tokenizer's private headers (tokenizer_internal.h, unicode.h) are
#                     included only under src/tokenizer
#   src/lua_bindings  includes its own headers and headers of include/ only: ember.h, the one named
#                     internal header (ember_internal.h) and the tools' public ember_tiny_model.h;
#                     never an engine, tokenizer, kernels or tools header directly
#   include/          the public headers include each other and the layers' public headers only
#                     (types.h, cpu.h, tokenizer.h), never an engine or tools header
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
# calls into the engine (GGUF, hooks, models, sessions), the tokenizer or Lua; ember_error_set is
# the kernels' own (src/kernels/error.c)
engine_calls='\bember_gguf_[a-z_]*\(|\bember_hook_call\(|\bember_model_[a-z_]*\(|\bember_session_[a-z_]*\(|\blua_[a-z]*\('
up=$(grep -lE "$engine_calls|\bember_tokenizer_[a-z_]*\(|\bember_detok_[a-z_]*\(" "$src"/src/kernels/*.[ch])
[ -z "$up" ] || fail "kernel files call engine, tokenizer or Lua functions:" $up

for f in "$src"/src/tokenizer/*.[ch]; do
  while IFS= read -r inc; do
    name=${inc##*:}
    case $name in
      \<*) [[ $name =~ $lua_header ]] && fail "$inc: a tokenizer file includes Lua";;
      \"*) h=${name//\"/}
           [ -f "$src/src/tokenizer/$h" ] || [ -f "$src/src/kernels/$h" ] ||
             fail "$inc: a tokenizer file includes '$h'; the tokenizer uses its own and the kernels' headers only";;
    esac
  done < <(includes "$f")
done
up=$(grep -lE "$engine_calls" "$src"/src/tokenizer/*.[ch])
[ -z "$up" ] || fail "tokenizer files call engine or Lua functions:" $up

# the tokenizer's private headers stay in its room
for f in $(find "$src/src" "$src/include" "$src/tools" "$src/tests" -name '*.[ch]' -not -path "$src/src/tokenizer/*"); do
  while IFS= read -r inc; do
    name=${inc##*:}
    case $name in
      \"tokenizer_internal.h\"|\"unicode.h\") fail "$inc: includes the tokenizer's private ${name//\"/}";;
    esac
  done < <(includes "$f")
done

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
             */*) fail "$inc: a binding includes '$h' by path; bindings use their own and include/'s headers";;
             *) [ -f "$src/src/lua_bindings/$h" ] || [ -f "$src/include/$h" ] ||
                  fail "$inc: a binding includes '$h'; bindings use their own headers and include/ (ember.h, ember_internal.h, ember_tiny_model.h) only";;
           esac;;
    esac
  done < <(includes "$f")
done

for f in "$src"/include/*.h; do
  while IFS= read -r inc; do
    name=${inc##*:}
    case $name in
      \"*) h=${name//\"/}
           case $h in
             types.h|cpu.h|tokenizer.h) ;;
             *) [ -f "$src/include/$h" ] ||
                  fail "$inc: a public header includes '$h'; include/ uses itself, types.h, cpu.h and tokenizer.h only";;
           esac;;
    esac
  done < <(includes "$f")
done

if [ $bad -gt 0 ]; then echo "$bad layer violation(s)"; exit 1; fi
echo "layers hold: kernels <- tokenizer <- engine <- bindings (include/ the bindings' only headers beside their own)"
