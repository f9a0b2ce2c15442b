/* fuzz_lua_state.h — the Lua state the Lua-facing harnesses share: standard libraries, ember.core,
 * cjson and lpeg preloaded, lib/ember from the source tree. Shared by fuzz_lua.c and fuzz_tokenizer.c. */
#ifndef EMBER_FUZZ_LUA_STATE_H
#define EMBER_FUZZ_LUA_STATE_H

#include <lua.h>

/* A new state ready to require("ember.*") from the source tree the harnesses were built from. */
lua_State *ember_fuzz_lua_new(void);

#endif
