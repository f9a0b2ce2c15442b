/* l_fs.h — core.internal's file-system calls (l_fs.c): stat, list_dir, mkdir, mkdir_p,
 * remove_tree, realpath, which lib/ember/store/fs.lua makes without spawning a process. */
#ifndef EMBER_L_FS_H
#define EMBER_L_FS_H

#include "lbind.h"

/* Adds stat, list_dir, mkdir, mkdir_p, remove_tree and realpath to module.internal. */
void ember_lua_open_fs(lua_State *L, int module);

#endif
