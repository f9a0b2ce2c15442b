/* l_tiny_model.c — ember.make_tiny_model: the project's deterministic random-weight model generator
 * (tools/tiny_model.c, the one `make-tiny-model` runs) for Lua, so the default model can be made
 * on first use by any ember build. Must not pick paths or defaults: lib/ember/model/default_model.lua does. */
#include "l_tiny_model.h"

#include <string.h>

#include "ember_tiny_model.h"

static const char *const tiny_options[] = {"family", "dtype", "seed", NULL};

/* ember.make_tiny_model(path, { family = "llama", dtype = "q8_0", seed = 1 }) -> true | nil, msg.
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
