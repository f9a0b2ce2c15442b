/* fuzz_tokenizer.c — libFuzzer harness: any bytes as a tokenizer.json through the real loader
 * (lib/ember/model/tokenizer.lua on lua-cjson, which feeds the C builder), then encode and decode of a
 * fixed text and of the input's own first bytes. One Lua state serves every input; a Lua error is
 * the expected answer to bad bytes, a crash or sanitizer report is a bug. */
#include "fuzz_input.h"
#include "fuzz_lua_state.h"

#include <lauxlib.h>
#include <lua.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Runs for each input: load, then encode/decode; returns nothing, errors are caught by pcall. */
static const char driver[] = "local path, sample = ...\n"
                             "local tokenizer = require('ember.model.tokenizer')\n"
                             "local ok, tok = pcall(tokenizer, { file = path, config = false })\n"
                             "if not ok then return end\n"
                             "for _, text in ipairs({ 'Hello world, 123 \\u{e9}t\\u{e9}\\n\\n  <s>x', sample }) do\n"
                             "  local ok2, ids = pcall(tok.encode, tok, text, { special = true })\n"
                             "  if ok2 then pcall(tok.decode, tok, ids) end\n"
                             "end\n"
                             "tok:close()\n";

static lua_State *state(void) {
    static lua_State *L;
    if (L) return L;
    L = ember_fuzz_lua_new();
    if (luaL_loadbuffer(L, driver, sizeof driver - 1, "=fuzz_tokenizer") != LUA_OK) abort();
    lua_setfield(L, LUA_REGISTRYINDEX, "ember.fuzz.driver");
    return L;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    lua_State *L = state();
    const char *path = ember_fuzz_file(data, size);
    lua_getfield(L, LUA_REGISTRYINDEX, "ember.fuzz.driver");
    lua_pushstring(L, path);
    lua_pushlstring(L, (const char *)data, size < 64 ? size : 64);
    if (lua_pcall(L, 2, 0, 0) != LUA_OK) {
        /* only the driver's own bugs land here: the loader's errors are caught inside it */
        fprintf(stderr, "fuzz_tokenizer driver: %s\n", lua_tostring(L, -1));
        abort();
    }
    lua_gc(L, LUA_GCCOLLECT, 0); /* tokenizers are freed now, so leaks are seen per input */
    return 0;
}
