/* lember.c — the Lua module `ember.core`: module table, small module functions (version, cpu,
 * sha256) and the helpers every binding file shares. Holds no engine state of its own. */
#include "lbind.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "l_control_vector.h"
#include "l_experiment.h"
#include "l_fs.h"
#include "l_model.h"
#include "l_model_lens.h"
#include "l_sae.h"
#include "l_sampler.h"
#include "l_session.h"
#include "l_tensor.h"
#include "l_tensor_ops.h"
#include "l_tiny_model.h"
#include "l_tokenizer.h"
#include "l_trace.h"

volatile sig_atomic_t ember_lua_interrupted = 0;
lua_State *volatile ember_lua_running = NULL;

/* ---- classes ----------------------------------------------------------------------------------- */

/* __index of every ember class: methods first (the common case), then property getters.
 * upvalue 1: methods table, upvalue 2: getters table. [self, key] */
static int class_index(lua_State *L) {
    lua_pushvalue(L, 2);
    if (lua_rawget(L, lua_upvalueindex(1)) != LUA_TNIL) return 1; /* [self, key, method] */
    lua_pop(L, 1);
    lua_pushvalue(L, 2);
    if (lua_rawget(L, lua_upvalueindex(2)) == LUA_TNIL) return 1; /* [self, key, nil] */
    lua_pushvalue(L, 1);                                          /* [self, key, getter, self] */
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

/* Nearest once case and '_' are ignored; ties go to the nearer spelling as written. */
const char *ember_lua_closest(const char *word, const char *const *valid) {
    const char *best = NULL;
    size_t best_d = (size_t)-1, best_raw = (size_t)-1;
    for (size_t i = 0; valid[i]; i++) {
        size_t d = ember_lua_fold_distance(word, valid[i]), raw = edit_distance(word, valid[i]);
        if (d < best_d || (d == best_d && raw < best_raw)) {
            best_d = d;
            best_raw = raw;
            best = valid[i];
        }
    }
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

/* ---- module functions -------------------------------------------------------------------------- */

/* ember.cpu() -> { avx2 = bool, ..., kernels = best set this CPU supports } */
static int l_cpu(lua_State *L) {
    const ember_cpu_features *f = ember_cpu();
    lua_createtable(L, 0, 10);
    struct {
        const char *name;
        bool on;
    } flags[] = {
        {"avx2", f->avx2},
        {"fma", f->fma},
        {"f16c", f->f16c},
        {"avx512f", f->avx512f},
        {"avx512bw", f->avx512bw},
        {"avx512vl", f->avx512vl},
        {"avx512vnni", f->avx512vnni},
        {"avx512bf16", f->avx512bf16},
    };
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        lua_pushboolean(L, flags[i].on);
        lua_setfield(L, -2, flags[i].name);
    }
    /* "avx512": whether the avx512 kernel set can run (its full requirement, VNNI included);
     * "kernels": the set `auto` picks, from the one owner of that rule. */
    lua_pushboolean(L, ember_kernels_supported(EMBER_KERNELS_AVX512));
    lua_setfield(L, -2, "avx512");
    lua_pushstring(L, ember_kernels_name(ember_kernels_best()));
    lua_setfield(L, -2, "kernels");
    /* the default thread count (physical cores) and the CPUs this process may use */
    lua_pushinteger(L, ember_cpu_physical_cores());
    lua_setfield(L, -2, "physical_cores");
    lua_pushinteger(L, ember_cpu_logical_cores());
    lua_setfield(L, -2, "logical_cores");
    return 1;
}

static int l_sha256(lua_State *L) {
    size_t n;
    const char *s = luaL_checklstring(L, 1, &n);
    char hex[65];
    ember_sha256_hex(s, n, hex);
    lua_pushstring(L, hex);
    return 1;
}

/* A missing or unreadable file is an expected failure: nil, message (documented). */
static int l_sha256_file(lua_State *L) {
    const char *path = luaL_checkstring(L, 1);
    char hex[65];
    ember_error err = {0};
    if (ember_sha256_file_hex(path, hex, &err) != EMBER_OK) {
        lua_pushnil(L);
        lua_pushstring(L, err.msg);
        return 2;
    }
    lua_pushstring(L, hex);
    return 1;
}

/* core.read_file(path, max_bytes) -> contents | nil, message. Only regular files, opened without
 * blocking (a FIFO or a directory is an error naming it), at most max_bytes: the one way lib/ember
 * reads an input file it does not control (tokenizer.json, tokenizer_config.json). */
static int l_read_file(lua_State *L) {
    const char *path = luaL_checkstring(L, 1);
    lua_Integer max = luaL_checkinteger(L, 2);
    luaL_argcheck(L, max >= 0, 2, "max_bytes must be >= 0");
    char *data;
    size_t len;
    ember_error err = {0};
    void **holder = ember_lua_box(L, free); /* [.., holder]: frees the buffer if pushing it raises */
    if (ember_file_read_all(path, (size_t)max, &data, &len, &err) != EMBER_OK) {
        lua_pushnil(L);
        lua_pushstring(L, err.msg);
        return 2;
    }
    *holder = data;
    lua_pushlstring(L, data, len); /* [.., holder, contents] */
    *holder = NULL;
    free(data);
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

/* ember.now_ms() -> milliseconds from a monotonic clock (for measurements; the origin means nothing) */
static int l_now_ms(lua_State *L) {
    lua_pushnumber(L, ember_lua_now_ms());
    return 1;
}

/* ember.now() -> wall-clock seconds since the Unix epoch, to the microsecond (os.time is whole
 * seconds and os.clock is processor time: neither times a generation). */
static int l_now(lua_State *L) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    lua_pushnumber(L, (lua_Number)ts.tv_sec + (lua_Number)ts.tv_nsec * 1e-9);
    return 1;
}

/* core.internal.clear_interrupt(): forgets a Ctrl-C that Lua has already handled (generate kept
 * the partial result), so the next generation does not stop at once. */
static int l_clear_interrupt(lua_State *L) {
    (void)L;
    ember_lua_interrupted = 0;
    return 0;
}

static const luaL_Reg module_funcs[] = {
    {"now", l_now},       {"cpu", l_cpu},       {"read_file", l_read_file},
    {"now_ms", l_now_ms}, {"sha256", l_sha256}, {"sha256_file", l_sha256_file},
    {NULL, NULL},
};

LUAMOD_API int luaopen_ember_core(lua_State *L) {
    luaL_checkversion(L);
    lua_newtable(L); /* [core] */
    int module = lua_gettop(L);
    luaL_setfuncs(L, module_funcs, 0);
    lua_pushstring(L, EMBER_VERSION);
    lua_setfield(L, module, "version");
    /* ember.kernel_sets: the choices of --kernels / EMBER_KERNELS, from the kernels' own list */
    lua_createtable(L, EMBER_KERNELS_COUNT, 0);
    for (int k = 0; k < EMBER_KERNELS_COUNT; k++) {
        lua_pushstring(L, ember_kernels_name((ember_kernels)k));
        lua_rawseti(L, -2, k + 1);
    }
    lua_setfield(L, module, "kernel_sets");

    luaL_newmetatable(L, EMBER_LUA_BOX); /* [core, mt] */
    lua_pushcfunction(L, box_gc);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, box_gc);
    lua_setfield(L, -2, "__close");
    lua_pop(L, 1); /* [core] */

    ember_lua_open_tensor(L, module);
    ember_lua_open_tensor_ops(L, module);
    ember_lua_open_experiment(L, module);
    ember_lua_open_model(L, module);
    ember_lua_open_model_lens(L, module);
    ember_lua_open_session(L, module);
    ember_lua_open_tiny_model(L, module);
    ember_lua_open_sampler(L, module);
    ember_lua_open_tokenizer(L, module);
    ember_lua_open_control_vector(L, module);
    ember_lua_open_sae(L, module);
    ember_lua_open_fs(L, module);
    ember_lua_open_trace(L, module);
    lua_pushboolean(L, 1);
    lua_setfield(L, module, "has_tokenizer");
    static const luaL_Reg internal[] = {
        {"check_options", l_check_options},     {"opt_int", l_opt_int}, {"opt_num", l_opt_num},
        {"clear_interrupt", l_clear_interrupt}, {"closest", l_closest}, {NULL, NULL}};
    ember_lua_set_internal(L, module, internal);

    /* The class metatables, so lib/ember can add Lua-side methods and getters, and the REPL can
     * list what a userdata offers. */
    lua_newtable(L); /* [core, classes] */
    const char *classes[][2] = {{"Model", EMBER_LUA_MODEL},     {"Session", EMBER_LUA_SESSION},
                                {"Tensor", EMBER_LUA_TENSOR},   {"TensorView", EMBER_LUA_VIEW},
                                {"Context", EMBER_LUA_CONTEXT}, {"Sampler", EMBER_LUA_SAMPLER},
                                {"Trace", EMBER_LUA_TRACE}};
    for (size_t i = 0; i < sizeof classes / sizeof classes[0]; i++) {
        luaL_getmetatable(L, classes[i][1]);
        lua_setfield(L, -2, classes[i][0]);
    }
    lua_setfield(L, module, "classes"); /* [core] */
    return 1;
}
