/* lbind.c — the helpers every binding file shares (lbind.h): classes, option tables, GC boxes, the
 * clock, the interrupt flag, and their core.internal wrappers. Must not know any one binding file. */
#include "lbind.h"

#include <string.h>
#include <time.h>

volatile sig_atomic_t ember_lua_interrupted = 0;
lua_State *volatile ember_lua_running = NULL;

/* ---- classes ----------------------------------------------------------------------------------- */

static bool nearer(const char *word, const char *name, size_t *best_d, size_t *best_raw);

/* A key this close to a method or property (case and '_' aside) is a misspelling of it. */
#define CLASS_NEAR_MISS 2

/* Raises when the string key at 2 misspells one of the class's methods or properties (m:sesion{}
 * would only say "attempt to call a nil value"); returns quietly for any other key, which reads
 * as nil. upvalues 1, 2: the methods and getters tables. [self, key, nil] */
static void refuse_near_miss(lua_State *L) {
    if (lua_type(L, 2) != LUA_TSTRING || lua_rawlen(L, 2) < 3) return;
    const char *key = lua_tostring(L, 2), *best = NULL;
    size_t best_d = (size_t)-1, best_raw = (size_t)-1;
    for (int t = 1; t <= 2; t++) {
        lua_pushnil(L);
        while (lua_next(L, lua_upvalueindex(t))) { /* [.., k, v]: keys stay alive in the tables */
            lua_pop(L, 1);
            if (lua_type(L, -1) == LUA_TSTRING && nearer(key, lua_tostring(L, -1), &best_d, &best_raw))
                best = lua_tostring(L, -1);
        }
    }
    if (!best || best_d > CLASS_NEAR_MISS) return;
    const char *cls = luaL_getmetafield(L, 1, "__name") == LUA_TSTRING ? lua_tostring(L, -1) : "this object";
    luaL_error(L, "%s has no method or property '%s' (did you mean '%s'?)", cls, key, best);
}

/* __index of every ember class: methods first (the common case), then property getters; a near
 * miss of either raises with the one meant. upvalue 1: methods table, upvalue 2: getters table.
 * [self, key] */
static int class_index(lua_State *L) {
    lua_pushvalue(L, 2);
    if (lua_rawget(L, lua_upvalueindex(1)) != LUA_TNIL) return 1; /* [self, key, method] */
    lua_pop(L, 1);
    lua_pushvalue(L, 2);
    if (lua_rawget(L, lua_upvalueindex(2)) == LUA_TNIL) { /* [self, key, nil] */
        refuse_near_miss(L);
        return 1;
    }
    lua_pushvalue(L, 1); /* [self, key, getter, self] */
    lua_call(L, 1, 1);
    return 1;
}

void ember_lua_new_class(lua_State *L, const char *tname, const luaL_Reg *methods, const luaL_Reg *meta,
                         const luaL_Reg *getters) {
    luaL_newmetatable(L, tname); /* [mt] (also sets mt.__name = tname) */
    if (meta) luaL_setfuncs(L, meta, 0);
    lua_newtable(L); /* [mt, methods] */
    if (methods) luaL_setfuncs(L, methods, 0);
    lua_pushvalue(L, -1);
    lua_setfield(L, -3, "__methods");
    lua_newtable(L); /* [mt, methods, getters] */
    if (getters) luaL_setfuncs(L, getters, 0);
    lua_pushvalue(L, -1);
    lua_setfield(L, -4, "__getters");
    lua_pushcclosure(L, class_index, 2); /* [mt, __index] */
    lua_setfield(L, -2, "__index");      /* [mt] */
}

void ember_lua_set_internal(lua_State *L, int module, const luaL_Reg *fns) {
    if (lua_getfield(L, module, "internal") != LUA_TTABLE) { /* [internal|nil] */
        lua_pop(L, 1);
        lua_newtable(L);
        lua_pushvalue(L, -1);
        lua_setfield(L, module, "internal");
    }
    luaL_setfuncs(L, fns, 0);
    lua_pop(L, 1);
}

/* ---- option tables ----------------------------------------------------------------------------- */

/* Edit distance, for "did you mean" hints; short strings only (option and hook names). */
static size_t edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63) return la > lb ? la : lb;
    size_t prev[64], cur[64];
    for (size_t j = 0; j <= lb; j++) prev[j] = j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
            size_t del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
        memcpy(prev, cur, (lb + 1) * sizeof prev[0]);
    }
    return prev[lb];
}

/* word lower-cased without '_' into out (at most 63 characters; longer words are cut). */
static void fold(const char *word, char out[64]) {
    size_t n = 0;
    for (; *word && n < 63; word++)
        if (*word != '_') out[n++] = (char)(*word >= 'A' && *word <= 'Z' ? *word - 'A' + 'a' : *word);
    out[n] = '\0';
}

size_t ember_lua_fold_distance(const char *word, const char *name) {
    char a[64], b[64];
    fold(word, a);
    fold(name, b);
    return edit_distance(a, b);
}

/* Whether name is nearer to word than the best so far (case and '_' aside, ties to the nearer
 * spelling as written); if so it becomes the best. */
static bool nearer(const char *word, const char *name, size_t *best_d, size_t *best_raw) {
    size_t d = ember_lua_fold_distance(word, name), raw = edit_distance(word, name);
    if (d > *best_d || (d == *best_d && raw >= *best_raw)) return false;
    *best_d = d;
    *best_raw = raw;
    return true;
}

const char *ember_lua_closest(const char *word, const char *const *valid) {
    const char *best = NULL;
    size_t best_d = (size_t)-1, best_raw = (size_t)-1;
    for (size_t i = 0; valid[i]; i++)
        if (nearer(word, valid[i], &best_d, &best_raw)) best = valid[i];
    return best;
}

void ember_lua_check_options(lua_State *L, int idx, const char *fname, const char *const *valid) {
    idx = lua_absindex(L, idx);
    lua_pushnil(L);
    while (lua_next(L, idx)) { /* [key, value] */
        lua_pop(L, 1);
        if (lua_type(L, -1) != LUA_TSTRING) {
            luaL_error(L, "bad argument to '%s' (option keys must be strings, got %s)", fname, luaL_typename(L, -1));
        }
        const char *k = lua_tostring(L, -1);
        bool ok = false;
        for (size_t i = 0; valid[i] && !ok; i++) ok = strcmp(k, valid[i]) == 0;
        if (!ok) {
            luaL_Buffer b;
            luaL_buffinit(L, &b);
            for (size_t i = 0; valid[i]; i++) {
                if (i) luaL_addstring(&b, ", ");
                luaL_addstring(&b, valid[i]);
            }
            luaL_pushresult(&b);
            luaL_error(L, "bad argument to '%s' (unknown option '%s', did you mean '%s'? valid: %s)", fname, k,
                       ember_lua_closest(k, valid), lua_tostring(L, -1));
        }
    }
}

lua_Integer ember_lua_opt_int_field(lua_State *L, int idx, const char *fname, const char *key, lua_Integer def) {
    lua_getfield(L, idx, key);
    lua_Integer v = def;
    if (!lua_isnil(L, -1)) {
        int isint;
        v = lua_tointegerx(L, -1, &isint);
        if (!isint)
            luaL_error(L, "bad argument to '%s' (option '%s' must be an integer, got %s)", fname, key,
                       lua_type(L, -1) == LUA_TNUMBER ? "a non-integral number" : luaL_typename(L, -1));
    }
    lua_pop(L, 1);
    return v;
}

lua_Number ember_lua_opt_num_field(lua_State *L, int idx, const char *fname, const char *key, lua_Number def) {
    lua_getfield(L, idx, key);
    lua_Number v = def;
    if (!lua_isnil(L, -1)) {
        if (lua_type(L, -1) != LUA_TNUMBER)
            luaL_error(L, "bad argument to '%s' (option '%s' must be a number, got %s)", fname, key,
                       luaL_typename(L, -1));
        v = lua_tonumber(L, -1);
    }
    lua_pop(L, 1);
    return v;
}

/* The returned string stays valid while the options table holds it (the caller's argument). */
const char *ember_lua_opt_str_field(lua_State *L, int idx, const char *fname, const char *key, const char *def) {
    lua_getfield(L, idx, key);
    const char *v = def;
    if (!lua_isnil(L, -1)) {
        if (lua_type(L, -1) != LUA_TSTRING)
            luaL_error(L, "bad argument to '%s' (option '%s' must be a string, got %s)", fname, key,
                       luaL_typename(L, -1));
        v = lua_tostring(L, -1);
    }
    lua_pop(L, 1);
    return v;
}

/* ---- boxes ------------------------------------------------------------------------------------- */

typedef struct {
    void *ptr;
    void (*free_fn)(void *);
} box;

static int box_gc(lua_State *L) {
    box *b = luaL_checkudata(L, 1, EMBER_LUA_BOX);
    if (b->ptr && b->free_fn) b->free_fn(b->ptr);
    b->ptr = NULL;
    return 0;
}

void **ember_lua_box(lua_State *L, void (*free_fn)(void *)) {
    box *b = lua_newuserdatauv(L, sizeof *b, 0); /* [box] */
    b->ptr = NULL;
    b->free_fn = free_fn;
    luaL_setmetatable(L, EMBER_LUA_BOX);
    return &b->ptr;
}

double ember_lua_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---- the option helpers for Lua code (core.internal) ------------------------------------------ */

/* core.internal.check_options(opts, fname, { valid names... }): ember_lua_check_options. */
static int l_check_options(lua_State *L) {
    luaL_checktype(L, 1, LUA_TTABLE);
    const char *fname = luaL_checkstring(L, 2);
    luaL_checktype(L, 3, LUA_TTABLE);
    const char *valid[64];
    lua_Integer n = (lua_Integer)lua_rawlen(L, 3);
    if (n > 63) return luaL_error(L, "check_options: at most 63 valid names, got %I", n);
    for (lua_Integer i = 1; i <= n; i++) {
        lua_rawgeti(L, 3, i); /* the strings stay alive in the list at index 3 */
        valid[i - 1] = lua_tostring(L, -1);
        if (!valid[i - 1]) return luaL_error(L, "check_options: valid name %I is not a string", i);
        lua_pop(L, 1);
    }
    valid[n] = NULL;
    ember_lua_check_options(L, 1, fname, valid);
    return 0;
}

/* core.internal.opt_int(opts, fname, key, default) and opt_num: the option readers C uses, so a
 * Lua caller accepts and refuses exactly what a C one does, with the same message. */
static int l_opt_int(lua_State *L) {
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_pushinteger(
        L, ember_lua_opt_int_field(L, 1, luaL_checkstring(L, 2), luaL_checkstring(L, 3), luaL_checkinteger(L, 4)));
    return 1;
}

static int l_opt_num(lua_State *L) {
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_pushnumber(
        L, ember_lua_opt_num_field(L, 1, luaL_checkstring(L, 2), luaL_checkstring(L, 3), luaL_checknumber(L, 4)));
    return 1;
}

/* core.internal.closest(word, names) -> the name nearest to word (ember_lua_closest: case and '_'
 * set aside) and its distance, or nothing for an empty list: the one near-miss rule for the Lua
 * library's "did you mean" (command-line flags). */
static int l_closest(lua_State *L) {
    const char *word = luaL_checkstring(L, 1);
    luaL_checktype(L, 2, LUA_TTABLE);
    lua_Integer n = luaL_len(L, 2);
    if (n < 1) return 0;
    const char **names = lua_newuserdatauv(L, (size_t)(n + 1) * sizeof *names, 0); /* [word, names, ud] */
    for (lua_Integer i = 1; i <= n; i++) {
        lua_rawgeti(L, 2, i); /* the string stays alive in the table while this runs */
        if (lua_type(L, -1) != LUA_TSTRING) return luaL_error(L, "closest: names[%d] is not a string", (int)i);
        names[i - 1] = lua_tostring(L, -1);
        lua_pop(L, 1);
    }
    names[n] = NULL;
    const char *best = ember_lua_closest(word, names);
    lua_pushstring(L, best);
    lua_pushinteger(L, (lua_Integer)ember_lua_fold_distance(word, best));
    return 2;
}

void ember_lua_open_helpers(lua_State *L, int module) {
    luaL_newmetatable(L, EMBER_LUA_BOX); /* [mt] */
    lua_pushcfunction(L, box_gc);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, box_gc);
    lua_setfield(L, -2, "__close");
    lua_pop(L, 1);
    static const luaL_Reg internal[] = {{"check_options", l_check_options},
                                        {"opt_int", l_opt_int},
                                        {"opt_num", l_opt_num},
                                        {"closest", l_closest},
                                        {NULL, NULL}};
    ember_lua_set_internal(L, module, internal);
}
