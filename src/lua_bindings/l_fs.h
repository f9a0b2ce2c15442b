/* l_fs.h — core.internal's file-system calls (l_fs.c): stat, list_dir, mkdir, mkdir_p,
 * remove_tree, realpath, which lib/ember/store/fs.lua makes without spawning a process, and the
 * temporaries rule (temp_sibling, temp_writer_dead, temp_mark). */
#ifndef EMBER_L_FS_H
#define EMBER_L_FS_H

#include "lbind.h"

/* Adds stat, list_dir, mkdir, mkdir_p, remove_tree, realpath, isatty, temp_sibling,
 * temp_writer_dead and temp_mark to module.internal. */
void ember_lua_open_fs(lua_State *L, int module);

#endif
