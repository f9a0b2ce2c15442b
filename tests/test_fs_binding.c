/* test_fs_binding.c — core.internal's directory changes (src/lua_bindings/l_fs.c) driven from C, so
 * the walk and its error path also run under ASan+UBSan: mkdir_p and remove_tree of a tree far
 * deeper than nftw's open descriptors, links out of it left alone, the exact messages of failures. */
#define _GNU_SOURCE /* mkdtemp, setgroups */
#include "lbind.h"
#include "test_support.h"

#include <errno.h>
#include <grp.h>
#include <lualib.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define DEPTH 300 /* levels of the deep tree: far beyond the 16 descriptors the walk keeps open */

/* snprintf that counts a cut-off result as a failed check (the paths here are short). */
static void fmt(char *out, size_t cap, const char *f, ...) __attribute__((format(printf, 3, 4)));
static void fmt(char *out, size_t cap, const char *f, ...) {
    va_list ap;
    va_start(ap, f);
    int n = vsnprintf(out, cap, f, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= cap) CHECKF(false, "a test string of %d bytes does not fit %zu", n, cap);
}

/* core.internal.NAME(path) as one string: "true", a resolved path, or "nil|message". */
static const char *call(lua_State *L, const char *name, const char *path, char *out, size_t cap) {
    lua_getglobal(L, "internal");
    lua_getfield(L, -1, name);
    lua_pushstring(L, path);
    if (lua_pcall(L, 1, 2, 0) != LUA_OK) {
        fmt(out, cap, "raised|%s", lua_tostring(L, -1));
        lua_pop(L, 2);
        return out;
    }
    if (lua_isnil(L, -2)) fmt(out, cap, "nil|%s", lua_tostring(L, -1));
    else if (lua_isboolean(L, -2)) fmt(out, cap, "%s", lua_toboolean(L, -2) ? "true" : "false");
    else fmt(out, cap, "%s", lua_tostring(L, -2));
    lua_pop(L, 3);
    return out;
}

static bool is_kind(const char *path, mode_t kind) {
    struct stat st;
    return lstat(path, &st) == 0 && (st.st_mode & S_IFMT) == kind;
}

static bool gone(const char *path) {
    struct stat st;
    return lstat(path, &st) != 0 && errno == ENOENT;
}

static void touch(const char *path) { CHECKF(ember_write_file(path, "x", 1), "cannot write %s", path); }

static void check_call(lua_State *L, const char *name, const char *path, const char *want) {
    char got[8192];
    call(L, name, path, got, sizeof got);
    CHECKF(strcmp(got, want) == 0, "%s('%s') gave '%s', expected '%s'", name, path, got, want);
}

/* A read-only directory holding a file: mkdir inside it and remove_tree of it fail with
 * "Permission denied" naming the entry. Returns the number of failed checks. */
static int permission_case(lua_State *L, const char *base) {
    char ro[4096], file[4096], sub[4096], want[8192];
    int before = ember_test_failed;
    fmt(ro, sizeof ro, "%s/ro", base);
    fmt(file, sizeof file, "%s/f", ro);
    fmt(sub, sizeof sub, "%s/x", ro);
    fmt(want, sizeof want, "nil|cannot create directory '%s': Permission denied", sub);
    check_call(L, "mkdir", sub, want);
    fmt(want, sizeof want, "nil|cannot remove '%s': Permission denied", file);
    check_call(L, "remove_tree", ro, want);
    CHECKF(is_kind(file, S_IFREG), "%s was removed from a read-only directory", file);
    return ember_test_failed - before;
}

int main(void) {
    lua_State *L = luaL_newstate();
    luaL_openlibs(L);
    luaL_requiref(L, "ember.core", luaopen_ember_core, 0); /* [core] */
    lua_getfield(L, -1, "internal");
    lua_setglobal(L, "internal");
    lua_pop(L, 1);

    char base[4096];
    fmt(base, sizeof base, "%s/fs-XXXXXX", ember_test_tmpdir());
    if (!mkdtemp(base)) return ember_test_skip("cannot make a scratch directory under the build tree");
    chmod(base, 0755); /* the unprivileged part below must be able to enter it */
    char outside[4096], keep[4096], tree[4096], want[8192], buf[8192];
    fmt(outside, sizeof outside, "%s/outside", base);
    fmt(keep, sizeof keep, "%s/keep", outside);
    fmt(tree, sizeof tree, "%s/tree", base);
    check_call(L, "mkdir", outside, "true");
    touch(keep);

    /* the deep tree: DEPTH nested "d" directories made by one mkdir_p, then at every level a
     * file, a link to the outside directory and a dangling link */
    char *deep = malloc(strlen(tree) + 2 * DEPTH + 1);
    strcpy(deep, tree);
    for (int i = 0; i < DEPTH; i++) strcat(deep, "/d");
    check_call(L, "mkdir_p", deep, "true");
    CHECK(is_kind(deep, S_IFDIR));
    check_call(L, "mkdir_p", deep, "true"); /* again: already there */
    for (int i = 0; i < DEPTH; i += 7) {
        size_t at = strlen(tree) + 2 * (size_t)(i + 1);
        char saved = deep[at];
        deep[at] = '\0';
        fmt(buf, sizeof buf, "%s/file", deep);
        touch(buf);
        fmt(buf, sizeof buf, "%s/out", deep);
        CHECK(symlink(outside, buf) == 0);
        fmt(buf, sizeof buf, "%s/dangling", deep);
        CHECK(symlink("nowhere", buf) == 0);
        deep[at] = saved;
    }
    check_call(L, "remove_tree", tree, "true");
    CHECKF(gone(tree), "%s is still there", tree);
    CHECKF(is_kind(keep, S_IFREG), "the link's target %s was removed", keep);
    free(deep);

    /* failures name the path and the OS reason */
    fmt(want, sizeof want, "nil|cannot create directory '%s': File exists", outside);
    check_call(L, "mkdir", outside, want);
    fmt(buf, sizeof buf, "%s/missing/x", base);
    fmt(want, sizeof want, "nil|cannot create directory '%s': No such file or directory", buf);
    check_call(L, "mkdir", buf, want);
    fmt(want, sizeof want, "nil|cannot resolve '%s': No such file or directory", buf);
    check_call(L, "realpath", buf, want);
    fmt(buf, sizeof buf, "%s/x/y", keep);
    fmt(want, sizeof want, "nil|cannot create directory '%s/x': Not a directory", keep);
    check_call(L, "mkdir_p", buf, want);
    fmt(want, sizeof want, "nil|cannot remove '%s': Not a directory", buf);
    check_call(L, "remove_tree", buf, want);
    check_call(L, "remove_tree", "", "nil|refusing to remove an empty path");
    /* "/" is left to spec/fs_dirs_spec.lua, which asks it as nobody: here, as root, a broken
     * refusal would remove the machine */
    lua_getglobal(L, "internal"); /* a NUL inside a path is misuse: raised, not cut short */
    lua_getfield(L, -1, "mkdir");
    lua_pushlstring(L, "a\0b", 3);
    CHECK(lua_pcall(L, 1, 0, 0) != LUA_OK && strstr(lua_tostring(L, -1), "NUL byte") != NULL);
    lua_pop(L, 2);

    /* permissions: in this process when it is not root; as root (which bypasses them) in a child
     * that drops to nobody, reporting its failed checks through the exit code */
    fmt(buf, sizeof buf, "%s/ro", base);
    check_call(L, "mkdir", buf, "true");
    fmt(buf, sizeof buf, "%s/ro/f", base);
    touch(buf);
    fmt(buf, sizeof buf, "%s/ro", base);
    chmod(buf, 0555);
    if (geteuid() != 0) {
        permission_case(L, base);
    } else {
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            if (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0) _exit(100);
            _exit(permission_case(L, base) == 0 ? 0 : 1);
        }
        int status = 0;
        CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
        CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0,
               "the permission checks as nobody failed (exit status %d; 100: could not drop to nobody)",
               WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    }
    chmod(buf, 0755);

    check_call(L, "remove_tree", base, "true");
    CHECKF(gone(base), "%s is still there", base);
    lua_close(L);
    return ember_test_finish();
}
