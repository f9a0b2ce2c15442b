/* l_tiny_model.c — ember.make_tiny_model: the project's deterministic random-weight model generator
 * (tools/tiny_model.c, the one `make-tiny-model` runs) for Lua, so the default model can be made
 * on first use by any ember build. Must not pick paths or defaults: lib/ember/model/default_model.lua does. */
#include "l_tiny_model.h"

#include <string.h>

#include "ember_tiny_model.h"

static const char *const tiny_options[] = {"family", "dtype", "seed", "tensor_types", NULL};

/* tensor_types = { "NAME=TYPE", ... } (make-tiny-model --tensor-type) into a NULL-terminated array
 * left on the stack; its strings are kept alive by the options table. NULL when absent. */
static const char *const *tensor_types(lua_State *L) {
    if (lua_getfield(L, 2, "tensor_types") == LUA_TNIL) return NULL; /* [.., nil] */
    luaL_argexpected(L, lua_istable(L, -1), 2, "tensor_types as a list of NAME=TYPE strings");
    lua_Integer n = (lua_Integer)lua_rawlen(L, -1);
    const char **list = lua_newuserdatauv(L, (size_t)(n + 1) * sizeof *list, 0); /* [.., tt, list] */
    for (lua_Integer i = 1; i <= n; i++) {
        if (lua_rawgeti(L, -2, i) != LUA_TSTRING)
            luaL_error(L, "bad argument to 'make_tiny_model' (tensor_types[%I] must be a NAME=TYPE string)", i);
        list[i - 1] = lua_tostring(L, -1);
        lua_pop(L, 1);
    }
    list[n] = NULL;
    return list;
}

/* ember.make_tiny_model(path, { family = "llama", dtype = "q8_0", seed = 1, tensor_types = { "N=T" } })
 * -> true | nil, msg.
 * The same arguments give the same bytes as `make-tiny-model --family F --dtype D --seed S`.
 * The file appears whole or not at all (the writer renames a finished temporary file). */
static int l_make_tiny_model(lua_State *L) {
    const char *path = luaL_checkstring(L, 1);
    if (!lua_isnoneornil(L, 2)) {
        luaL_checktype(L, 2, LUA_TTABLE);
        ember_lua_check_options(L, 2, "make_tiny_model", tiny_options);
    } else {
        lua_settop(L, 1);
        lua_newtable(L);
    }
    ember_tiny_model_params p;
    ember_tiny_model_defaults(&p);
    const char *family = ember_lua_opt_str_field(L, 2, "make_tiny_model", "family", "llama");
    bool known = false;
    for (int i = 0; ember_tiny_model_family(i) && !known; i++) known = strcmp(family, ember_tiny_model_family(i)) == 0;
    if (!known) {
        char list[256];
        ember_tiny_model_family_list(list, sizeof list);
        return luaL_error(L, "bad argument to 'make_tiny_model' (option 'family' must be one of %s, got '%s')", list,
                          family);
    }
    p.family = family;
    const char *dtype = ember_lua_opt_str_field(L, 2, "make_tiny_model", "dtype", "f32");
    if (!ember_tiny_model_parse_dtype(dtype, &p.dtype)) {
        char list[128];
        ember_tiny_model_dtype_list(list, sizeof list);
        return luaL_error(L, "bad argument to 'make_tiny_model' (option 'dtype' must be one of %s, got '%s')", list,
                          dtype);
    }
    lua_Integer seed = ember_lua_opt_int_field(L, 2, "make_tiny_model", "seed", 1);
    if (seed < 0) return luaL_error(L, "bad argument to 'make_tiny_model' (option 'seed' must be >= 0)");
    p.seed = (uint64_t)seed;
    p.tensor_types = tensor_types(L);
    ember_error err = {0};
    if (ember_tiny_model_write(&p, path, &err) != EMBER_OK) {
        lua_pushnil(L);
        lua_pushstring(L, err.msg);
        return 2;
    }
    lua_pushboolean(L, 1);
    return 1;
}

void ember_lua_open_tiny_model(lua_State *L, int module) {
    lua_pushcfunction(L, l_make_tiny_model);
    lua_setfield(L, module, "make_tiny_model");
}
