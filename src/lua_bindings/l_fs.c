/* l_fs.c — read-only file-system queries for lib/ember/fs.lua (what a path is, what a directory
 * holds), so a file test costs a system call rather than a /bin/sh. Never creates or removes. */
#define _POSIX_C_SOURCE 200809L
#include "l_fs.h"

#include <dirent.h>
#include <errno.h>
#include <string.h>
#include <sys/stat.h>

static const char *type_name(mode_t mode) {
    if (S_ISREG(mode)) return "file";
    if (S_ISDIR(mode)) return "dir";
    if (S_ISLNK(mode)) return "link";
    if (S_ISFIFO(mode)) return "fifo";
    return "other";
}

/* core.internal.stat(path [, nofollow]) -> { type = "file"|"dir"|"link"|"fifo"|"other", size,
 * mtime } | nil, message. Follows symbolic links (as `test -d` does) unless nofollow is true;
 * a path that does not exist is the nil answer, not an error. */
static int l_stat(lua_State *L) {
    const char *path = luaL_checkstring(L, 1);
    int nofollow = lua_toboolean(L, 2);
    struct stat st;
    if ((nofollow ? lstat(path, &st) : stat(path, &st)) != 0) {
        lua_pushnil(L);
        lua_pushfstring(L, "'%s': %s", path, strerror(errno));
        return 2;
    }
    lua_createtable(L, 0, 3); /* [.., info] */
    lua_pushstring(L, type_name(st.st_mode));
    lua_setfield(L, -2, "type");
    lua_pushinteger(L, (lua_Integer)st.st_size);
    lua_setfield(L, -2, "size");
    lua_pushinteger(L, (lua_Integer)st.st_mtime);
    lua_setfield(L, -2, "mtime");
    return 1;
}

static void close_dir(void *d) { closedir(d); }

/* core.internal.list_dir(path) -> { names... } (unsorted, without "." and "..") | nil, message.
 * The DIR lives in a GC box so a memory error while filling the table does not leak it. */
static int l_list_dir(lua_State *L) {
    const char *path = luaL_checkstring(L, 1);
    void **box = ember_lua_box(L, close_dir); /* [.., box] */
    DIR *d = opendir(path);
    if (!d) {
        lua_pushnil(L);
        lua_pushfstring(L, "'%s': %s", path, strerror(errno));
        return 2;
    }
    *box = d;
    lua_newtable(L); /* [.., box, names] */
    lua_Integer n = 0;
    const struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        lua_pushstring(L, e->d_name);
        lua_rawseti(L, -2, ++n);
    }
    *box = NULL;
    closedir(d);
    return 1;
}

void ember_lua_open_fs(lua_State *L, int module) {
    static const luaL_Reg internal[] = {{"stat", l_stat}, {"list_dir", l_list_dir}, {NULL, NULL}};
    ember_lua_set_internal(L, module, internal);
}
