/* module.c — the entry of build/lua/ember/core.so, the same core loaded by stock lua5.4
 * (`require("ember.core")`). Links no liblua: the host interpreter provides the Lua API. */
#include "lbind.h"

/* The module's code lives in the ember_lua_core static library. Taking the entry's address here
 * makes the linker pull lember.c (and so everything it uses) into core.so, where
 * luaopen_ember_core is exported for `require`. */
extern int (*const ember_core_entry)(lua_State *L);
int (*const ember_core_entry)(lua_State *L) = luaopen_ember_core;
