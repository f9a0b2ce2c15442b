/* fuzz_lua_state.c — builds the harnesses' Lua state (fuzz_lua_state.h). Loads no driver and runs
 * no input: each harness adds its own driver on top. */
#include "fuzz_lua_state.h"

#include <lauxlib.h>
#include <lualib.h>

int luaopen_ember_core(lua_State *L);
int luaopen_cjson(lua_State *L);
int luaopen_lpeg(lua_State *L);

#ifndef EMBER_SOURCE_DIR
#error "EMBER_SOURCE_DIR must name the source tree (its lib/ holds the Lua library)"
#endif

lua_State *ember_fuzz_lua_new(void) {
    lua_State *L = luaL_newstate();
    luaL_openlibs(L);
    luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE); /* [preload] */
    lua_pushcfunction(L, luaopen_ember_core);
    lua_setfield(L, -2, "ember.core");
    lua_pushcfunction(L, luaopen_cjson);
    lua_setfield(L, -2, "cjson");
    lua_pushcfunction(L, luaopen_lpeg);
    lua_setfield(L, -2, "lpeg");
    lua_pop(L, 1);
    lua_getglobal(L, "package"); /* [package] */
    lua_pushstring(L, EMBER_SOURCE_DIR "/lib/?.lua;" EMBER_SOURCE_DIR "/lib/?/init.lua");
    lua_setfield(L, -2, "path");
    lua_pop(L, 1);
    return L;
}
