/* l_gradients.c — core.internal.gradients: one evaluation with a backward pass on a session of its
 * own (ember_session_gradients), its gradients (and values) copied into owned Tensors. The options
 * arrive parsed by lib/ember/model/gradients.lua, which owns the user-facing names; this file never
 * tokenizes, never parses metric strings and keeps nothing. */
#include "l_gradients.h"

#include <string.h>

#include "l_model.h"
#include "l_tensor.h"

static const char *const metric_names[] = {"logit", "logit-diff", "logprob", "prob", "kl", NULL};

/* Reads ids (a table of integers) into a buffer on the stack; the engine checks the vocabulary. */
static int32_t *read_ids(lua_State *L, int idx, int64_t *n) {
    luaL_checktype(L, idx, LUA_TTABLE);
    *n = (int64_t)lua_rawlen(L, idx);
    if (*n < 1) luaL_error(L, "gradients: ids is empty: at least one token id is needed");
    int32_t *ids = lua_newuserdatauv(L, (size_t)*n * sizeof *ids, 0);
    for (int64_t i = 0; i < *n; i++) {
        lua_rawgeti(L, idx, i + 1);
        int ok;
        lua_Integer id = lua_tointegerx(L, -1, &ok);
        if (!ok || id < INT32_MIN || id > INT32_MAX) luaL_error(L, "gradients: ids[%I] is not a token id", i + 1);
        ids[i] = (int32_t)id;
        lua_pop(L, 1);
    }
    return ids;
}

static int32_t field_token(lua_State *L, int idx, const char *key) {
    lua_getfield(L, idx, key);
    int ok;
    lua_Integer v = lua_tointegerx(L, -1, &ok);
    lua_pop(L, 1);
    return ok && v >= INT32_MIN && v <= INT32_MAX ? (int32_t)v : -1;
}

static bool field_bool(lua_State *L, int idx, const char *key) {
    lua_getfield(L, idx, key);
    bool b = lua_toboolean(L, -1);
    lua_pop(L, 1);
    return b;
}

/* opts.metric = { kind =, a =, b =, reference = Tensor } into req (the reference stays on the stack). */
static void read_metric(lua_State *L, int opts, ember_grad_request *req) {
    if (lua_getfield(L, opts, "metric") != LUA_TTABLE) luaL_error(L, "gradients: metric must be a table");
    const int mt = lua_gettop(L);
    lua_getfield(L, mt, "kind");
    req->metric.kind = (ember_metric_kind)luaL_checkoption(L, -1, NULL, metric_names);
    lua_pop(L, 1);
    req->metric.a = field_token(L, mt, "a");
    req->metric.b = field_token(L, mt, "b");
    if (lua_getfield(L, mt, "reference") != LUA_TNIL) {
        int64_t rows, cols;
        req->metric.reference = ember_lua_check_values(L, lua_gettop(L), &rows, &cols, "gradients");
    }
}

/* opts.stages = { name, ... } (the engine's stage names) into req->stages. */
static void read_stages(lua_State *L, int opts, ember_grad_request *req) {
    if (lua_getfield(L, opts, "stages") != LUA_TTABLE) luaL_error(L, "gradients: stages must be a table");
    for (lua_Integer i = 1; lua_rawgeti(L, -1, i) != LUA_TNIL; i++) {
        const char *name = luaL_checkstring(L, -1);
        int found = -1;
        for (int s = 0; s < EMBER_STAGE_COUNT && found < 0; s++)
            if (strcmp(name, ember_stage_name((ember_stage)s)) == 0) found = s;
        if (found < 0) luaL_error(L, "gradients: unknown stage '%s'", name);
        req->stages[found] = true;
        lua_pop(L, 1);
    }
    lua_pop(L, 2);
}

/* Pushes a copy of (data, rows, cols) as an owned Tensor, its heads laid out as the stage's view. */
static void push_copy(lua_State *L, ember_stage st, int64_t n_heads, const float *data, int64_t rows, int64_t cols) {
    ember_lua_tensor *t = ember_lua_push_tensor(L, rows, cols);
    memcpy(t->data, data, (size_t)(rows * cols) * sizeof(float));
    const ember_stage_heads by = ember_stage_get(st)->heads; /* the stage table's layout */
    if (by != EMBER_HEADS_NONE) {
        t->n_heads = n_heads;
        t->heads_by = by == EMBER_HEADS_ROWS ? EMBER_LUA_HEADS_ROWS : EMBER_LUA_HEADS_COLUMNS;
    }
}

typedef const float *(*entry_fn)(const ember_gradients *, ember_stage, int64_t, int64_t *, int64_t *);

/* Pushes { stage = Tensor (once per evaluation) | { [layer] = Tensor } } of what get() holds. */
static void push_stage_table(lua_State *L, const ember_gradients *g, const ember_grad_request *req,
                             const ember_model_info *info, entry_fn get) {
    lua_newtable(L);
    for (int s = 0; s < EMBER_STAGE_COUNT; s++) {
        if (!req->stages[s]) continue;
        const ember_stage st = (ember_stage)s;
        int64_t rows, cols;
        const float *once = get(g, st, -1, &rows, &cols);
        if (once) push_copy(L, st, info->n_heads, once, rows, cols);
        else {
            lua_newtable(L);
            for (int64_t l = 0; l < info->n_layers; l++) {
                const float *d = get(g, st, l, &rows, &cols);
                if (!d) continue;
                push_copy(L, st, info->n_heads, d, rows, cols);
                lua_rawseti(L, -2, l);
            }
        }
        lua_setfield(L, -2, ember_stage_name(st));
    }
}

/* Frees the gradients when the box is collected: nothing leaks when a copy raises. */
static int gradients_box_gc(lua_State *L) {
    ember_gradients **box = lua_touserdata(L, 1);
    ember_gradients_free(*box);
    *box = NULL;
    return 0;
}

/* core.internal.gradients(model, ids, opts) -> { metric = number, gradients = {...}, values = {...}
 * (when opts.values), embeddings = Tensor (when opts.embeddings) }. opts: metric = { kind, a, b,
 * reference }, stages = { names }, embeddings, values, freeze_attention, freeze_norm. */
static int l_gradients(lua_State *L) {
    ember_lua_model *lm = ember_lua_check_model(L, 1);
    int64_t n;
    const int32_t *ids = read_ids(L, 2, &n);
    luaL_checktype(L, 3, LUA_TTABLE);
    ember_grad_request req = {0};
    read_metric(L, 3, &req);
    read_stages(L, 3, &req);
    req.embeddings = field_bool(L, 3, "embeddings");
    req.values = field_bool(L, 3, "values");
    req.freeze_attention = field_bool(L, 3, "freeze_attention");
    req.freeze_norm = field_bool(L, 3, "freeze_norm");
    ember_gradients **box = lua_newuserdatauv(L, sizeof *box, 0);
    *box = NULL;
    lua_createtable(L, 0, 1);
    lua_pushcfunction(L, gradients_box_gc);
    lua_setfield(L, -2, "__gc");
    lua_setmetatable(L, -2);
    ember_session *s = NULL;
    ember_error err = {0};
    ember_status st = ember_session_new(lm->m, n, &s, &err);
    if (st == EMBER_OK) st = ember_session_gradients(s, ids, n, &req, box, &err);
    ember_session_free(s);
    if (st != EMBER_OK) return luaL_error(L, "%s", err.msg);
    const ember_model_info *info = ember_model_get_info(lm->m);
    lua_createtable(L, 0, 4);
    lua_pushnumber(L, ember_gradients_metric(*box));
    lua_setfield(L, -2, "metric");
    push_stage_table(L, *box, &req, info, ember_gradients_get);
    lua_setfield(L, -2, "gradients");
    if (req.values) {
        push_stage_table(L, *box, &req, info, ember_gradients_value);
        lua_setfield(L, -2, "values");
    }
    int64_t rows, cols;
    const float *e = ember_gradients_embeddings(*box, &rows, &cols);
    if (e) {
        push_copy(L, EMBER_STAGE_BEFORE_LAYER, 0, e, rows, cols);
        lua_setfield(L, -2, "embeddings");
    }
    ember_gradients_free(*box);
    *box = NULL;
    return 1;
}

void ember_lua_open_gradients(lua_State *L, int module) {
    static const luaL_Reg internal[] = {{"gradients", l_gradients}, {NULL, NULL}};
    ember_lua_set_internal(L, module, internal);
}
