/* l_model_lens.c — the read-only research methods of ember.Model: model:unembed (the logit lens),
 * model:weight (a stored tensor, dequantized), model:tensors (the list of them) and
 * model:final_norm_frozen (the final norm of residual components with a frozen scale). Each result
 * is made for the call; the model keeps nothing, and hook contexts reach none of them (they carry
 * no model handle). */
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

/* The 0-based row ids of the list at idx, into a scratch userdata left on the stack. */
static int64_t *check_row_list(lua_State *L, int idx, int64_t *n) {
    luaL_checktype(L, idx, LUA_TTABLE);
    *n = (int64_t)lua_rawlen(L, idx);
    if (*n < 1) luaL_error(L, "weight: the row list is empty (give 0-based row ids)");
    if (*n > EMBER_LUA_MAX_ELEMENTS) luaL_error(L, "weight: %I rows are too many", (lua_Integer)*n);
    int64_t *rows = lua_newuserdatauv(L, (size_t)*n * sizeof(int64_t), 0); /* [.., rows] */
    for (int64_t i = 0; i < *n; i++) {
        lua_rawgeti(L, idx, (lua_Integer)i + 1);
        int isint;
        lua_Integer r = lua_tointegerx(L, -1, &isint);
        if (!isint)
            luaL_error(L, "weight: row %I of the list is not an integer (rows are 0-based ids)", (lua_Integer)i + 1);
        rows[i] = (int64_t)r;
        lua_pop(L, 1);
    }
    return rows;
}

/* model:weight(name [, rows]) -> Tensor [n_out, n_in]: the GGUF tensor `name` (".weight" optional)
 * as f32, e.g. model:weight("blk.3.attn_output") is W_O of layer 3 as stored, [hidden,
 * n_heads*head_dim]; with rows (a list of 0-based row ids), only those rows, [#rows, n_in] (a few
 * tokens' rows of the LM head without the whole table). */
static int m_weight(lua_State *L) {
    ember_lua_model *lm = ember_lua_check_model(L, 1);
    const char *name = luaL_checkstring(L, 2);
    int64_t n_out, n_in, n_rows = 0;
    ember_error err = {0};
    if (ember_model_weight_shape(lm->m, name, &n_out, &n_in, &err) != EMBER_OK) return luaL_error(L, "%s", err.msg);
    const int64_t *rows = lua_isnoneornil(L, 3) ? NULL : check_row_list(L, 3, &n_rows);
    const int64_t n = rows ? n_rows : n_out;
    if (!ember_lua_shape_ok(n, n_in))
        return luaL_error(L, "weight: '%s' has [%I, %I] values, more than 2^32", name, (lua_Integer)n,
                          (lua_Integer)n_in);
    ember_lua_tensor *out = ember_lua_push_tensor(L, n, n_in); /* [model, name, (rows, scratch,) out] */
    ember_status st = rows ? ember_model_weight_rows_f32(lm->m, name, rows, n, out->data, &err)
                           : ember_model_weight_f32(lm->m, name, out->data, &err);
    if (st != EMBER_OK) return luaL_error(L, "%s", err.msg);
    return 1;
}

/* model:tensors() -> { { name =, type =, shape = { ... }, bytes = }, ... }: every tensor of the file, in its
 * order; shape outermost first (a matrix is { n_out, n_in }, as model:weight returns it). */
static int m_tensors(lua_State *L) {
    ember_lua_model *lm = ember_lua_check_model(L, 1);
    int64_t n = ember_model_tensor_count(lm->m);
    lua_createtable(L, n > INT32_MAX ? INT32_MAX : (int)n, 0); /* [model, list] */
    ember_tensor_desc d;
    for (int64_t i = 0; i < n && ember_model_tensor_desc(lm->m, i, &d); i++) {
        lua_createtable(L, 0, 3); /* [model, list, entry] */
        lua_pushstring(L, d.name);
        lua_setfield(L, -2, "name");
        lua_pushstring(L, d.type);
        lua_setfield(L, -2, "type");
        lua_createtable(L, d.n_dims, 0);
        for (int k = 0; k < d.n_dims; k++) {
            lua_pushinteger(L, (lua_Integer)d.ne[d.n_dims - 1 - k]);
            lua_rawseti(L, -2, k + 1);
        }
        lua_setfield(L, -2, "shape");
        lua_pushinteger(L, (lua_Integer)d.bytes);
        lua_setfield(L, -2, "bytes");
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
    return 1;
}

/* model:final_norm_frozen(x, ref) -> Tensor [rows, hidden]: the rows of x (residual components)
 * through the final norm with the scale of ref frozen (ref: one row for all, or one per row of x),
 * times the norm's weight and without its bias (ember_model_final_norm_frozen). */
static int m_final_norm_frozen(lua_State *L) {
    ember_lua_model *lm = ember_lua_check_model(L, 1);
    const ember_model_info *in = ember_model_get_info(lm->m);
    int64_t rows, cols, ref_rows, ref_cols;
    const float *x = ember_lua_check_values(L, 2, &rows, &cols, "final_norm_frozen");
    const float *ref = ember_lua_check_values(L, 3, &ref_rows, &ref_cols, "final_norm_frozen");
    if (cols != in->hidden_size || ref_cols != in->hidden_size || (ref_rows != 1 && ref_rows != rows))
        return luaL_error(L,
                          "final_norm_frozen: expected [rows, %I] components and a [1, %I] or [rows, %I] reference, "
                          "got [%I, %I] and [%I, %I]",
                          (lua_Integer)in->hidden_size, (lua_Integer)in->hidden_size, (lua_Integer)in->hidden_size,
                          (lua_Integer)rows, (lua_Integer)cols, (lua_Integer)ref_rows, (lua_Integer)ref_cols);
    ember_lua_tensor *out = ember_lua_push_tensor(L, rows, cols);
    ember_error err = {0};
    if (ember_model_final_norm_frozen(lm->m, x, rows, ref, ref_rows, out->data, &err) != EMBER_OK)
        return luaL_error(L, "%s", err.msg);
    return 1;
}

/* model:same_tensor(other, name) -> true when both models bind a tensor `name` of the same type,
 * shape and bytes (ember_model_tensor_same); false when either lacks it. */
static int m_same_tensor(lua_State *L) {
    ember_lua_model *a = ember_lua_check_model(L, 1);
    ember_lua_model *b = ember_lua_check_model(L, 2);
    lua_pushboolean(L, ember_model_tensor_same(a->m, b->m, luaL_checkstring(L, 3)));
    return 1;
}

void ember_lua_open_model_lens(lua_State *L, int module) {
    static const luaL_Reg methods[] = {{"unembed", m_unembed},
                                       {"weight", m_weight},
                                       {"tensors", m_tensors},
                                       {"same_tensor", m_same_tensor},
                                       {"final_norm_frozen", m_final_norm_frozen},
                                       {NULL, NULL}};
    (void)module;
    luaL_getmetatable(L, EMBER_LUA_MODEL); /* [mt] */
    lua_getfield(L, -1, "__methods");      /* [mt, methods] */
    luaL_setfuncs(L, methods, 0);
    lua_pop(L, 2);
}
