/* l_control_vector.c — core.read_control_vector(path): the direction.N tensors of a llama.cpp
 * control-vector GGUF (read and checked by src/engine/control_vector.c) as owned ember.Tensors.
 * Must not decide where they are added: lib/ember/run/control_vector.lua does (llama.cpp's mapping). */
#include "l_control_vector.h"

#include <string.h>

#include "ember_internal.h"
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

void ember_lua_open_control_vector(lua_State *L, int module) {
    lua_pushcfunction(L, l_read_control_vector);
    lua_setfield(L, module, "read_control_vector");
}
