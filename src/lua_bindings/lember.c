/* lember.c — the entry of the Lua module `ember.core`: the module table, its small functions
 * (version, cpu, sha256, read_file, clocks) and the opening of every binding file. The helpers the
 * files share are lbind.c's; no binding file includes this one. Holds no engine state of its own. */
#include "lbind.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "l_batch.h"
#include "l_control_vector.h"
#include "l_experiment.h"
#include "l_fs.h"
#include "l_model.h"
#include "l_gradients.h"
#include "l_model_lens.h"
#include "l_sae.h"
#include "l_sampler.h"
#include "l_session.h"
#include "l_tensor.h"
#include "l_tensor_ops.h"
#include "l_tiny_model.h"
#include "l_tokenizer.h"
#include "l_trace.h"

/* ---- module functions -------------------------------------------------------------------------- */

/* ember.cpu() -> { avx2 = bool, ... (every feature of the kernels' feature table), avx512 = bool,
 * kernels = best set this CPU supports, physical_cores =, logical_cores = } */
static int l_cpu(lua_State *L) {
    const ember_cpu_features *f = ember_cpu();
    lua_createtable(L, 0, ember_cpu_feature_count() + 4);
    for (int i = 0; i < ember_cpu_feature_count(); i++) {
        lua_pushboolean(L, ember_cpu_feature_on(f, i));
        lua_setfield(L, -2, ember_cpu_feature_name(i));
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

/* ember.kernel_sets: the choices of --kernels / EMBER_KERNELS, from the kernels' own table, and
 * ember.KERNEL_SETS: that table's rows { name =, requires = { feature, ... } }, each also under its
 * name; requires lists the CPU features the set is compiled for (none for auto and reference). */
static void push_kernel_sets(lua_State *L, int module) {
    lua_createtable(L, EMBER_KERNELS_COUNT, 0);                   /* [names] */
    lua_createtable(L, EMBER_KERNELS_COUNT, EMBER_KERNELS_COUNT); /* [names, sets] */
    for (int k = 0; k < EMBER_KERNELS_COUNT; k++) {
        const char *name = ember_kernels_name((ember_kernels)k);
        lua_pushstring(L, name);
        lua_rawseti(L, -3, k + 1);
        lua_createtable(L, 0, 2); /* [names, sets, row] */
        lua_pushstring(L, name);
        lua_setfield(L, -2, "name");
        lua_newtable(L); /* [names, sets, row, requires] */
        for (int i = 0, n = 0; i < ember_cpu_feature_count(); i++)
            if (ember_kernels_requires((ember_kernels)k, i)) {
                lua_pushstring(L, ember_cpu_feature_name(i));
                lua_rawseti(L, -2, ++n);
            }
        lua_setfield(L, -2, "requires");
        lua_pushvalue(L, -1);
        lua_setfield(L, -3, name);
        lua_rawseti(L, -2, k + 1); /* [names, sets] */
    }
    lua_setfield(L, module, "KERNEL_SETS");
    lua_setfield(L, module, "kernel_sets");
}

/* core.WEIGHT_TYPES: every weight type ember reads (the traits with a to_float), in id order, each
 * row { name = "q4_k" (lower case, as llama-quantize and make-tiny-model spell it), id =, block_size =,
 * block_bytes = } and also under its name. */
static void push_weight_types(lua_State *L, int module) {
    lua_newtable(L); /* [types] */
    int n = 0;
    for (uint32_t t = 0; t < EMBER_TYPE_COUNT; t++) {
        const ember_type_traits *tt = ember_type_traits_get(t);
        if (!tt || !tt->to_float) continue;
        char name[32];
        size_t i = 0;
        for (; tt->name[i] && i + 1 < sizeof name; i++) name[i] = (char)tolower((unsigned char)tt->name[i]);
        name[i] = '\0';
        lua_createtable(L, 0, 4); /* [types, row] */
        lua_pushstring(L, name);
        lua_setfield(L, -2, "name");
        lua_pushinteger(L, (lua_Integer)t);
        lua_setfield(L, -2, "id");
        lua_pushinteger(L, (lua_Integer)tt->block_size);
        lua_setfield(L, -2, "block_size");
        lua_pushinteger(L, (lua_Integer)tt->block_bytes);
        lua_setfield(L, -2, "block_bytes");
        lua_pushvalue(L, -1);
        lua_setfield(L, -3, name);
        lua_rawseti(L, -2, ++n);
    }
    lua_setfield(L, module, "WEIGHT_TYPES");
}

LUAMOD_API int luaopen_ember_core(lua_State *L) {
    luaL_checkversion(L);
    lua_newtable(L); /* [core] */
    int module = lua_gettop(L);
    luaL_setfuncs(L, module_funcs, 0);
    lua_pushstring(L, EMBER_VERSION);
    lua_setfield(L, module, "version");
    push_kernel_sets(L, module);
    push_weight_types(L, module);

    ember_lua_open_helpers(L, module);
    ember_lua_open_tensor(L, module);
    ember_lua_open_tensor_ops(L, module);
    ember_lua_open_experiment(L, module);
    ember_lua_open_model(L, module);
    ember_lua_open_model_lens(L, module);
    ember_lua_open_gradients(L, module);
    ember_lua_open_session(L, module);
    ember_lua_open_batch(L, module);
    ember_lua_open_tiny_model(L, module);
    ember_lua_open_sampler(L, module);
    ember_lua_open_tokenizer(L, module);
    ember_lua_open_control_vector(L, module);
    ember_lua_open_sae(L, module);
    ember_lua_open_fs(L, module);
    ember_lua_open_trace(L, module);
    lua_pushboolean(L, 1);
    lua_setfield(L, module, "has_tokenizer");
    static const luaL_Reg internal[] = {{"clear_interrupt", l_clear_interrupt}, {NULL, NULL}};
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
