/* l_fs.c — the file-system calls of lib/ember/store/fs.lua and run/outputs.lua: what a path is, what a
 * directory holds, mkdir, mkdir -p, recursive removal, realpath, and the temporaries rule (names and
 * the provably-dead test, owned by src/engine/temp_name.c). System calls, never a /bin/sh. */
#define _XOPEN_SOURCE 700 /* nftw, realpath */
#include "l_fs.h"

#include "ember_internal.h"

#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Expected failures are `nil, "<what> 'PATH': <strerror>"`: the caller prefixes its own flag or
 * file name, and the OS reason ("Permission denied", "File exists") says what to fix. */
static int push_failure(lua_State *L, const char *what, const char *path, int err) {
    lua_pushnil(L);
    lua_pushfstring(L, "%s'%s': %s", what, path, strerror(err));
    return 2;
}

/* Argument `i` as a path: a Lua string with a NUL byte would name a different (shorter) path to
 * the C calls, so it is refused as misuse rather than silently cut. */
static const char *check_path(lua_State *L, int i, size_t *len) {
    size_t n;
    const char *path = luaL_checklstring(L, i, &n);
    if (strlen(path) != n) luaL_argerror(L, i, "path contains a NUL byte");
    if (len) *len = n;
    return path;
}

static const char *type_name(mode_t mode) {
    if (S_ISREG(mode)) return "file";
    if (S_ISDIR(mode)) return "dir";
    if (S_ISLNK(mode)) return "link";
    if (S_ISFIFO(mode)) return "fifo";
    return "other";
}

/* core.internal.stat(path [, nofollow]) -> { type = "file"|"dir"|"link"|"fifo"|"other", size,
 * mtime, ino } | nil, message. Follows symbolic links (as `test -d` does) unless nofollow is true;
 * a path that does not exist is the nil answer, not an error. */
static int l_stat(lua_State *L) {
    const char *path = luaL_checkstring(L, 1);
    int nofollow = lua_toboolean(L, 2);
    struct stat st;
    if ((nofollow ? lstat(path, &st) : stat(path, &st)) != 0) return push_failure(L, "", path, errno);
    lua_createtable(L, 0, 4); /* [.., info] */
    lua_pushstring(L, type_name(st.st_mode));
    lua_setfield(L, -2, "type");
    lua_pushinteger(L, (lua_Integer)st.st_size);
    lua_setfield(L, -2, "size");
    lua_pushinteger(L, (lua_Integer)st.st_mtime);
    lua_setfield(L, -2, "mtime");
    lua_pushinteger(L, (lua_Integer)st.st_ino); /* /proc/self/ns/pid: the PID namespace (fs.lua) */
    lua_setfield(L, -2, "ino");
    return 1;
}

static void close_dir(void *d) { closedir(d); }

/* core.internal.list_dir(path) -> { names... } (unsorted, without "." and "..") | nil, message.
 * The DIR lives in a GC box so a memory error while filling the table does not leak it. */
static int l_list_dir(lua_State *L) {
    const char *path = luaL_checkstring(L, 1);
    void **box = ember_lua_box(L, close_dir); /* [.., box] */
    DIR *d = opendir(path);
    if (!d) return push_failure(L, "", path, errno);
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

/* core.internal.mkdir(path [, mode]) -> true | nil, "cannot create directory 'PATH': reason". Mode
 * 0777 (or `mode`, e.g. 448 = 0700 for a private directory) less the umask, as mkdir(1); an
 * existing path of any kind is "File exists". */
static int l_mkdir(lua_State *L) {
    const char *path = check_path(L, 1, NULL);
    const lua_Integer mode = luaL_optinteger(L, 2, 0777);
    luaL_argcheck(L, mode >= 0 && mode <= 07777, 2, "mode must be in 0..07777");
    if (mkdir(path, (mode_t)mode) != 0) return push_failure(L, "cannot create directory ", path, errno);
    lua_pushboolean(L, 1);
    return 1;
}

/* mkdir(path) for mkdir -p: an existing directory (or a link to one) is success whatever
 * mkdir(2) said, since a read-only file system or an unwritable parent may answer EROFS or
 * EACCES before EEXIST. Returns 0 or the errno to report. */
static int make_one(const char *path) {
    if (mkdir(path, 0777) == 0) return 0;
    int err = errno;
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return 0;
    return err;
}

/* core.internal.mkdir_p(path) -> true | nil, "cannot create directory 'PREFIX': reason", PREFIX
 * being the first component that could not be made (as mkdir -p names it). Each prefix is made in
 * turn from a scratch copy of the path that the GC owns. */
static int l_mkdir_p(lua_State *L) {
    size_t len;
    const char *path = check_path(L, 1, &len);
    char *buf = lua_newuserdatauv(L, len + 1, 0); /* [.., scratch] */
    memcpy(buf, path, len + 1);
    for (size_t i = 1; i < len; i++) {
        /* the prefix ends at the first '/' after a component ("a//b": "a" once, not "a/") */
        if (buf[i] != '/' || buf[i - 1] == '/') continue;
        buf[i] = '\0';
        int err = make_one(buf);
        /* a prefix that exists but is not a directory is left to the next mkdir, which then says
         * "Not a directory" of the longer path, the one the user has to change */
        if (err != 0 && err != EEXIST) return push_failure(L, "cannot create directory ", buf, err);
        buf[i] = '/';
    }
    int err = make_one(path);
    if (err != 0) return push_failure(L, "cannot create directory ", path, err);
    lua_pushboolean(L, 1);
    return 1;
}

/* The first failure of one removal walk. nftw's callback takes no user pointer, so it is reached
 * through a per-thread pointer that l_remove_tree sets around the walk. */
typedef struct {
    void **path; /* GC box holding a malloc'd copy of the failed entry's path, or NULL */
    int err;     /* errno of the first failure; 0 while everything went */
} remove_state;

static _Thread_local remove_state *remove_current;

static void remove_note(const char *path, int err) {
    remove_state *s = remove_current;
    if (err == ENOENT) return; /* gone already (removed by someone else meanwhile): the goal */
    if (s->err != 0) return;   /* the first failure explains the later ones ("not empty") */
    s->err = err;
    *s->path = strdup(path); /* NULL when out of memory: the top path is named instead */
}

/* One entry of the walk, children before their directory (FTW_DEPTH); links are entries of
 * their own (FTW_PHYS), so unlink() removes the link and never what it points to. Always goes
 * on (returns 0), so everything that can be removed is, as rm -rf does. */
static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st;
    (void)ftw;
    int unreadable = errno; /* for FTW_DNR: why the directory could not be listed */
    switch (flag) {
    case FTW_DP:
    case FTW_D:
        if (rmdir(path) != 0) remove_note(path, errno);
        break;
    case FTW_DNR:
        /* an unlistable directory can still go when it is empty; if not, the reason to report
         * is the one that kept the walk out of it */
        if (rmdir(path) != 0) remove_note(path, (errno == ENOTEMPTY || errno == EEXIST) ? unreadable : errno);
        break;
    default: /* FTW_F, FTW_SL, FTW_SLN, FTW_NS */
        if (unlink(path) != 0) remove_note(path, errno);
        break;
    }
    return 0;
}

static int is_dot_or_dotdot(const char *name) { return strcmp(name, ".") == 0 || strcmp(name, "..") == 0; }

/* core.internal.remove_tree(path) -> true | nil, "cannot remove 'ENTRY': reason". Removes path
 * and everything below it without following a symbolic link anywhere: a link (at the top or
 * inside) is removed, its target is not touched. A path that does not exist is success (as
 * rm -rf). Refuses "", "/" (in any spelling that resolves to it) and a last component of "." or
 * "..", which rm -rf refuses too. */
static int l_remove_tree(lua_State *L) {
    size_t len;
    const char *arg = check_path(L, 1, &len);
    char *path = lua_newuserdatauv(L, len + 1, 0); /* [.., scratch] */
    memcpy(path, arg, len + 1);
    /* "link/" would make lstat and the walk follow the link: drop trailing slashes first */
    while (len > 0 && path[len - 1] == '/') path[--len] = '\0';
    if (len == 0) {
        lua_pushnil(L);
        lua_pushstring(L, arg[0] == '\0' ? "refusing to remove an empty path" : "refusing to remove '/'");
        return 2;
    }
    const char *slash = strrchr(path, '/');
    if (is_dot_or_dotdot(slash ? slash + 1 : path)) {
        lua_pushnil(L);
        lua_pushfstring(L, "refusing to remove '%s': its last component is '.' or '..'", arg);
        return 2;
    }
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT) { /* nothing there: done */
            lua_pushboolean(L, 1);
            return 1;
        }
        return push_failure(L, "cannot remove ", path, errno);
    }
    if (!S_ISDIR(st.st_mode)) {
        if (unlink(path) != 0) return push_failure(L, "cannot remove ", path, errno);
        lua_pushboolean(L, 1);
        return 1;
    }
    char real[PATH_MAX];
    if (realpath(path, real) != NULL && strcmp(real, "/") == 0) {
        lua_pushnil(L);
        lua_pushfstring(L, "refusing to remove '%s': it is '/'", arg);
        return 2;
    }
    void **failed = ember_lua_box(L, free); /* [.., scratch, box] */
    remove_state state = {failed, 0};
    remove_state *outer = remove_current;
    remove_current = &state;
    int rc = nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    int walk_err = errno;
    remove_current = outer;
    /* the walk itself stopped (ENOMEM, too deep, ...); the top vanishing meanwhile is success */
    if (state.err == 0 && rc != 0 && walk_err != ENOENT) state.err = walk_err != 0 ? walk_err : EIO;
    if (state.err != 0) return push_failure(L, "cannot remove ", *failed ? (const char *)*failed : path, state.err);
    lua_pushboolean(L, 1);
    return 1;
}

/* core.internal.realpath(path) -> the absolute path with every link, "." and ".." resolved
 * (realpath(3): every component must exist, as `realpath -e`) | nil, "cannot resolve 'PATH':
 * reason". The malloc'd answer sits in a GC box while it is copied into Lua. */
static int l_realpath(lua_State *L) {
    const char *path = check_path(L, 1, NULL);
    void **box = ember_lua_box(L, free); /* [.., box] */
    char *real = realpath(path, NULL);
    if (real == NULL) return push_failure(L, "cannot resolve ", path, errno);
    *box = real;
    lua_pushstring(L, real); /* [.., box, real] */
    *box = NULL;
    free(real);
    return 1;
}

/* core.internal.isatty(fd) -> whether file descriptor fd (0, 1, 2, ...) is a terminal. */
static int l_isatty(lua_State *L) {
    const lua_Integer fd = luaL_checkinteger(L, 1);
    lua_pushboolean(L, fd >= 0 && fd <= INT_MAX && isatty((int)fd) == 1);
    return 1;
}

/* core.internal.temp_sibling(path) -> PATH.ember-tmp-BOOT-PIDNS-PID-RANDOM (ember_temp_sibling). */
static int l_temp_sibling(lua_State *L) {
    size_t len;
    const char *path = check_path(L, 1, &len);
    luaL_Buffer b;
    size_t cap = len + 128;
    char *buf = luaL_buffinitsize(L, &b, cap);
    if (!ember_temp_sibling(path, buf, cap)) return luaL_error(L, "temp_sibling: name too long");
    luaL_pushresultsize(&b, strlen(buf));
    return 1;
}

/* core.internal.temp_writer_dead(name) -> whether the entry name is a temporary whose writer is
 * provably dead (ember_temp_writer_dead). */
static int l_temp_writer_dead(lua_State *L) {
    lua_pushboolean(L, ember_temp_writer_dead(check_path(L, 1, NULL)));
    return 1;
}

/* core.internal.temp_mark() -> the mark every temporary name carries (EMBER_TEMP_MARK). */
static int l_temp_mark(lua_State *L) {
    lua_pushliteral(L, EMBER_TEMP_MARK);
    return 1;
}

void ember_lua_open_fs(lua_State *L, int module) {
    static const luaL_Reg internal[] = {{"stat", l_stat},
                                        {"list_dir", l_list_dir},
                                        {"mkdir", l_mkdir},
                                        {"mkdir_p", l_mkdir_p},
                                        {"remove_tree", l_remove_tree},
                                        {"realpath", l_realpath},
                                        {"isatty", l_isatty},
                                        {"temp_sibling", l_temp_sibling},
                                        {"temp_writer_dead", l_temp_writer_dead},
                                        {"temp_mark", l_temp_mark},
                                        {NULL, NULL}};
    ember_lua_set_internal(L, module, internal);
}
