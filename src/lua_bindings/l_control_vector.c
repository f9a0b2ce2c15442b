/* l_control_vector.c — core.read_control_vector(path): the direction.N tensors of a llama.cpp
 * control-vector GGUF (read and checked by src/engine/control_vector.c) as owned ember.Tensors, and
 * core.write_control_vector(path, cv): tensors into that layout (the tools' writer). Must not decide
 * where directions are added (lib/ember/run/control_vector.lua) nor compute them
 * (lib/ember/analysis/cvector.lua). */
#include "l_control_vector.h"

#include <stdlib.h>
#include <string.h>

#include "ember_internal.h"
#include "ember_tiny_model.h"
#include "l_tensor.h"

static void control_vector_box_free(void *cv) { ember_control_vector_free(cv); }

/* core.read_control_vector(path) -> { n_embd =, model_hint = string|nil, layer_count = n|nil,
 *   directions = { { layer = N, tensor = ember.Tensor [1, n_embd] }, ... } } in file order.
 * Raises "control vector PATH: ..." for a file that cannot be read or is not a control vector. */
static int l_read_control_vector(lua_State *L) {
    const char *path = luaL_checkstring(L, 1);
    void **box = ember_lua_box(L, control_vector_box_free); /* [path, box] */
    ember_control_vector *cv = NULL;
    ember_error err = {0};
    if (ember_control_vector_read(path, &cv, &err) != EMBER_OK) {
        lua_pushstring(L, err.msg);
        return lua_error(L);
    }
    *box = cv;                /* freed by the box if anything below raises */
    lua_createtable(L, 0, 4); /* [path, box, result] */
    lua_pushinteger(L, (lua_Integer)cv->n_embd);
    lua_setfield(L, -2, "n_embd");
    if (cv->model_hint) {
        lua_pushstring(L, cv->model_hint);
        lua_setfield(L, -2, "model_hint");
    }
    if (cv->layer_count >= 0) {
        lua_pushinteger(L, (lua_Integer)cv->layer_count);
        lua_setfield(L, -2, "layer_count");
    }
    lua_createtable(L, (int)cv->n_directions, 0); /* [path, box, result, directions] */
    for (int64_t i = 0; i < cv->n_directions; i++) {
        lua_createtable(L, 0, 2); /* [..., directions, entry] */
        lua_pushinteger(L, (lua_Integer)cv->layers[i]);
        lua_setfield(L, -2, "layer");
        ember_lua_tensor *t = ember_lua_push_tensor(L, 1, cv->n_embd); /* [..., entry, tensor] */
        memcpy(t->data, cv->values + (size_t)i * (size_t)cv->n_embd, (size_t)cv->n_embd * sizeof(float));
        lua_setfield(L, -2, "tensor");          /* [..., directions, entry] */
        lua_rawseti(L, -2, (lua_Integer)i + 1); /* [..., directions] */
    }
    lua_setfield(L, -2, "directions"); /* [path, box, result] */
    ember_control_vector_free(cv);
    *box = NULL;
    return 1;
}

typedef struct {
    int64_t *layers; /* (n_dirs) */
    float *values;   /* (n_dirs, n_embd) */
} cv_buffers;

static void cv_buffers_free(void *p) {
    cv_buffers *b = p;
    free(b->layers);
    free(b->values);
    free(b);
}

/* The directions' layers and tensors of a write_control_vector argument, copied into b; raises
 * naming the entry. Returns n_embd. Checks everything before it allocates. */
static int64_t gather_directions(lua_State *L, int dirs, int64_t n, cv_buffers *b) {
    int64_t n_embd = -1;
    for (int64_t i = 0; i < n; i++) {
        lua_rawgeti(L, dirs, (lua_Integer)i + 1); /* [..., entry] */
        if (!lua_istable(L, -1)) luaL_error(L, "write_control_vector: directions[%d] is not a table", (int)i + 1);
        lua_getfield(L, -1, "tensor"); /* [..., entry, tensor] */
        const ember_lua_ref r = ember_lua_check_ref(L, -1, "write_control_vector");
        if (r.rows != 1) luaL_error(L, "write_control_vector: directions[%d].tensor must be [1, n]", (int)i + 1);
        if (n_embd < 0) n_embd = r.cols;
        if (r.cols != n_embd) {
            luaL_error(L, "write_control_vector: directions[%d] has %d values, directions[1] %d", (int)i + 1,
                       (int)r.cols, (int)n_embd);
        }
        lua_pop(L, 2);
    }
    b->layers = malloc((size_t)n * sizeof *b->layers);
    b->values = malloc((size_t)n * (size_t)n_embd * sizeof *b->values);
    if (!b->layers || !b->values) luaL_error(L, "write_control_vector: out of memory");
    for (int64_t i = 0; i < n; i++) {
        lua_rawgeti(L, dirs, (lua_Integer)i + 1);
        lua_getfield(L, -1, "layer"); /* [..., entry, layer] */
        int isint = 0;
        b->layers[i] = (int64_t)lua_tointegerx(L, -1, &isint);
        if (!isint) luaL_error(L, "write_control_vector: directions[%d].layer must be an integer", (int)i + 1);
        lua_getfield(L, -2, "tensor"); /* [..., entry, layer, tensor] */
        const ember_lua_ref r = ember_lua_check_ref(L, -1, "write_control_vector");
        for (int64_t j = 0; j < n_embd; j++) b->values[i * n_embd + j] = r.data[j];
        lua_pop(L, 3);
    }
    return n_embd;
}

/* core.write_control_vector(path, { model_hint = s, directions = { { layer = N, tensor = T [1, n] },
 * ... } }) -> true. Raises "control vector PATH: ..." (or "write_control_vector: ..." for a bad
 * argument). */
static int l_write_control_vector(lua_State *L) {
    const char *path = luaL_checkstring(L, 1);
    luaL_checktype(L, 2, LUA_TTABLE);
    lua_getfield(L, 2, "model_hint"); /* [path, cv, hint] */
    const char *hint = luaL_optstring(L, -1, "");
    lua_getfield(L, 2, "directions"); /* [path, cv, hint, dirs] */
    if (!lua_istable(L, -1)) luaL_error(L, "write_control_vector: directions must be a list");
    int dirs = lua_gettop(L);
    int64_t n = (int64_t)luaL_len(L, dirs);
    if (n < 1) luaL_error(L, "write_control_vector: directions is empty");
    void **box = ember_lua_box(L, cv_buffers_free); /* [path, cv, hint, dirs, box] */
    cv_buffers *b = calloc(1, sizeof *b);
    if (!b) luaL_error(L, "write_control_vector: out of memory");
    *box = b;
    int64_t n_embd = gather_directions(L, dirs, n, b);
    ember_error err = {0};
    if (ember_control_vector_write(path, hint, n_embd, n, b->layers, b->values, &err) != EMBER_OK) {
        lua_pushstring(L, err.msg);
        return lua_error(L); /* the box frees the buffers */
    }
    lua_pushboolean(L, 1);
    return 1;
}

void ember_lua_open_control_vector(lua_State *L, int module) {
    lua_pushcfunction(L, l_read_control_vector);
    lua_setfield(L, module, "read_control_vector");
    lua_pushcfunction(L, l_write_control_vector);
    lua_setfield(L, module, "write_control_vector");
}
