/* l_fs.h — core.internal.stat and core.internal.list_dir (l_fs.c): the file tests lib/ember/fs.lua
 * makes without spawning a process; luaopen_ember_core opens them. */
#ifndef EMBER_L_FS_H
#define EMBER_L_FS_H

#include "lbind.h"

/* Adds stat and list_dir to module.internal. */
void ember_lua_open_fs(lua_State *L, int module);

#endif
