/* l_model_lens.c — the read-only research methods of ember.Model: model:unembed (the logit lens)
 * and model:weight (a stored tensor, dequantized). Each result is a new owned Tensor made for the
 * call; the model keeps nothing, and hook contexts reach neither (they carry no model handle). */
#include "l_model_lens.h"
#include "l_model.h"
#include "l_tensor.h"

/* model:unembed(t) -> Tensor [rows, n_vocab]: t is a [rows, hidden_size] Tensor or live view of
 * the residual stream before the final norm (inside a hook too: the view is read, not kept). */
static int m_unembed(lua_State *L) {
    ember_lua_model *lm = ember_lua_check_model(L, 1);
    int64_t rows, cols;
    const float *x = ember_lua_check_values(L, 2, &rows, &cols, "unembed");
    const ember_model_info *in = ember_model_get_info(lm->m);
    if (cols != in->hidden_size)
        return luaL_error(L, "unembed: expected a [rows, %I] residual (hidden_size %I), got [%I, %I]",
                          (lua_Integer)in->hidden_size, (lua_Integer)in->hidden_size, (lua_Integer)rows,
                          (lua_Integer)cols);
    if (!ember_lua_shape_ok(rows, in->n_vocab))
        return luaL_error(L, "unembed: %I rows of %I logits exceed 2^32 values; unembed fewer rows at a time",
                          (lua_Integer)rows, (lua_Integer)in->n_vocab);
    ember_lua_tensor *out = ember_lua_push_tensor(L, rows, in->n_vocab); /* [model, t, out] */
    ember_error err = {0};
    if (ember_model_unembed(lm->m, x, rows, out->data, &err) != EMBER_OK) return luaL_error(L, "unembed: %s", err.msg);
    return 1;
}

/* model:weight(name) -> Tensor [n_out, n_in]: the GGUF tensor `name` (".weight" optional) as f32,
 * e.g. model:weight("blk.3.attn_output") is W_O of layer 3 as stored, [hidden, n_heads*head_dim]. */
static int m_weight(lua_State *L) {
    ember_lua_model *lm = ember_lua_check_model(L, 1);
    const char *name = luaL_checkstring(L, 2);
    int64_t n_out, n_in;
    ember_error err = {0};
    if (ember_model_weight_shape(lm->m, name, &n_out, &n_in, &err) != EMBER_OK) return luaL_error(L, "%s", err.msg);
    if (!ember_lua_shape_ok(n_out, n_in))
        return luaL_error(L, "weight: '%s' has [%I, %I] values, more than 2^32", name, (lua_Integer)n_out,
                          (lua_Integer)n_in);
    ember_lua_tensor *out = ember_lua_push_tensor(L, n_out, n_in); /* [model, name, out] */
    if (ember_model_weight_f32(lm->m, name, out->data, &err) != EMBER_OK) return luaL_error(L, "%s", err.msg);
    return 1;
}

void ember_lua_open_model_lens(lua_State *L, int module) {
    static const luaL_Reg methods[] = {{"unembed", m_unembed}, {"weight", m_weight}, {NULL, NULL}};
    (void)module;
    luaL_getmetatable(L, EMBER_LUA_MODEL); /* [mt] */
    lua_getfield(L, -1, "__methods");      /* [mt, methods] */
    luaL_setfuncs(L, methods, 0);
    lua_pop(L, 2);
}
