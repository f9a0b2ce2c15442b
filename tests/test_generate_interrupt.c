/* test_generate_interrupt.c — a host that raises the interrupt flag (ember_lua_interrupted, as
 * ember-lua's SIGINT handler does) without arming a Lua hook sees generate stop between tokens:
 * stop = "interrupted", the tokens so far kept (the same ids as an uninterrupted run), one decode
 * per kept token, no on_generation_complete, and the flag cleared. Runs lib/ember/model/generate.lua
 * from the source tree on the ember core, in a plain lua_State. */
#include "ember.h"
#include "lbind.h"
#include "test_support.h"
#include "ember_tiny_model.h"

#include <lualib.h>
#include <string.h>

int luaopen_lpeg(lua_State *L);
int luaopen_cjson(lua_State *L);

/* raise_interrupt(): what the host's signal handler does, minus the Lua hook. */
static int l_raise_interrupt(lua_State *L) {
    (void)L;
    ember_lua_interrupted = 1;
    return 0;
}

static const char *const script =
    "local path = ...\n"
    "local ember = require('ember')\n"
    "local m = ember.load{ model = path, kernels = 'reference' }\n"
    "local base = m:generate{ ids = { 1, 2, 3 }, max_tokens = 8, eos = false }\n"
    "local completed = false\n"
    "local exp = { name = 'watch', on_generation_complete = function() completed = true end }\n"
    "local n = 0\n"
    "local out = m:generate{ ids = { 1, 2, 3 }, max_tokens = 8, eos = false, experiment = exp,\n"
    "  on_token = function() n = n + 1; if n == 3 then raise_interrupt() end end }\n"
    "local early = m:generate{ ids = { 1, 2, 3 }, max_tokens = 8, eos = false, experiment = { name = 'p',\n"
    "  after_logits = function(_, ctx) if ctx.phase == 'prefill' then raise_interrupt() end end } }\n"
    "return out.stop, #out.ids, out.stats.decode_count, completed,\n"
    "  table.concat(out.ids, ',') == table.concat(base.ids, ',', 1, 3), early.stop, #early.ids, base.stop\n";

int main(void) {
    char path[1200];
    snprintf(path, sizeof path, "%s/interrupt-llama.gguf", ember_test_tmpdir());
    ember_tiny_model_params p;
    ember_tiny_model_defaults(&p);
    ember_error err = {0};
    if (ember_tiny_model_write(&p, path, &err) != EMBER_OK) {
        CHECK_MSG(false, "write: %.900s", err.msg);
        return ember_test_finish();
    }
    lua_State *L = luaL_newstate();
    luaL_openlibs(L);
    luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE); /* [preload] */
    lua_pushcfunction(L, luaopen_ember_core);
    lua_setfield(L, -2, "ember.core");
    lua_pushcfunction(L, luaopen_lpeg);
    lua_setfield(L, -2, "lpeg");
    lua_pushcfunction(L, luaopen_cjson);
    lua_setfield(L, -2, "cjson");
    lua_pop(L, 1);
    lua_getglobal(L, "package");
    lua_pushstring(L, EMBER_SOURCE_LIB "/?.lua;" EMBER_SOURCE_LIB "/?/init.lua");
    lua_setfield(L, -2, "path");
    lua_pop(L, 1);
    lua_register(L, "raise_interrupt", l_raise_interrupt);

    if (luaL_loadstring(L, script) != LUA_OK || (lua_pushstring(L, path), lua_pcall(L, 1, 8, 0)) != LUA_OK) {
        CHECK_MSG(false, "script: %s", lua_tostring(L, -1));
    } else {
        CHECK_MSG(strcmp(lua_tostring(L, 1), "interrupted") == 0, "stop = %s", lua_tostring(L, 1));
        CHECK_MSG(lua_tointeger(L, 2) == 3, "%lld ids kept, expected 3", (long long)lua_tointeger(L, 2));
        CHECK_MSG(lua_tointeger(L, 3) == 3, "%lld decodes, expected 3", (long long)lua_tointeger(L, 3));
        CHECK_MSG(!lua_toboolean(L, 4), "on_generation_complete ran for an interrupted generation");
        CHECK_MSG(lua_toboolean(L, 5), "the kept ids differ from the uninterrupted run's first three");
        CHECK_MSG(strcmp(lua_tostring(L, 6), "interrupted") == 0, "flag raised in prefill: stop = %s",
                  lua_tostring(L, 6));
        CHECK_MSG(lua_tointeger(L, 7) == 0, "flag raised in prefill: %lld ids", (long long)lua_tointeger(L, 7));
        CHECK_MSG(strcmp(lua_tostring(L, 8), "max_tokens") == 0, "uninterrupted run: stop = %s", lua_tostring(L, 8));
        CHECK(ember_lua_interrupted == 0);
    }
    lua_close(L);
    return ember_test_finish();
}
