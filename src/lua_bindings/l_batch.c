/* l_batch.c — ember.Batch: model:batch{size=N, context=C} holds N sequences (each its own KV
 * cache and position), and b:prefill / b:decode evaluate several of them in one pass
 * (ember_batch_eval), an experiment's tensor hooks seeing every sequence's rows (ctx.sequences,
 * view:sequence(i)). Sequences are numbered from 1. Never loops over tokens in Lua. */
#include "l_batch.h"

#include <string.h>

#include "l_experiment.h"
#include "l_tensor.h"

#define EMBER_LUA_BATCH "ember.Batch"
#define BATCH_CLOSED_MSG "attempt to use a closed batch"

typedef struct {
    ember_batch *b;         /* NULL once closed */
    ember_lua_model *model; /* kept alive by the batch's user value */
    bool busy;
} lua_batch;

static void batch_free(lua_batch *lb) {
    if (!lb->b) return;
    ember_batch_free(lb->b);
    lb->b = NULL;
    ember_lua_model_release(lb->model);
}

static lua_batch *check_batch(lua_State *L, int i, const char *fname) {
    lua_batch *lb = luaL_checkudata(L, i, EMBER_LUA_BATCH);
    if (!lb->b) luaL_error(L, BATCH_CLOSED_MSG);
    if (lb->model->closed) luaL_error(L, "%s: attempt to use a batch of a closed model", fname);
    if (lb->busy) luaL_error(L, "%s: the batch is busy (a hook cannot re-enter the batch it is running in)", fname);
    return lb;
}

/* model:batch{size = N, context = C} */
static int m_batch(lua_State *L) {
    static const char *const valid[] = {"size", "context", NULL};
    ember_lua_model *lm = ember_lua_check_model(L, 1);
    luaL_checktype(L, 2, LUA_TTABLE);
    ember_lua_check_options(L, 2, "batch", valid);
    const lua_Integer size = ember_lua_opt_int_field(L, 2, "batch", "size", 0);
    const lua_Integer n_ctx = ember_lua_opt_int_field(L, 2, "batch", "context", 0);
    if (size < 1) return luaL_error(L, "bad argument #1 to 'batch' (option 'size' must be >= 1, got %I)", size);
    if (n_ctx < 0) return luaL_error(L, "bad argument #1 to 'batch' (option 'context' must be >= 0, got %I)", n_ctx);
    lua_batch *lb = lua_newuserdatauv(L, sizeof *lb, 1); /* [model, opts, batch] */
    lb->b = NULL;
    lb->model = lm;
    lb->busy = false;
    luaL_setmetatable(L, EMBER_LUA_BATCH);
    lua_pushvalue(L, 1);
    lua_setiuservalue(L, -2, 1);
    ember_error err = {0};
    if (ember_batch_new(lm->m, size, n_ctx, &lb->b, &err) != EMBER_OK) return luaL_error(L, "%s", err.msg);
    lm->n_sessions++;
    return 1;
}

/* A sequence number (1-based) of the batch, checked. */
static int64_t check_seq(lua_State *L, lua_batch *lb, lua_Integer i, const char *fname) {
    const int64_t n = ember_batch_size(lb->b);
    if (i < 1 || i > n) luaL_error(L, "%s: sequence %I is outside 1..%I", fname, i, (lua_Integer)n);
    return (int64_t)i - 1;
}

/* Token ids of the table at idx into a GC-managed buffer pushed on the stack; an empty table is
 * left to the engine, which names the sequence. */
static int32_t *read_ids(lua_State *L, int idx, int64_t n_vocab, const char *fname, lua_Integer seq, int64_t *n) {
    idx = lua_absindex(L, idx);
    if (!lua_istable(L, idx))
        luaL_error(L, "bad argument to '%s' (sequence %I: a table of token ids expected, got %s)", fname, seq,
                   luaL_typename(L, idx));
    const lua_Integer len = (lua_Integer)lua_rawlen(L, idx);
    int32_t *ids = lua_newuserdatauv(L, (size_t)(len > 0 ? len : 1) * sizeof *ids, 0);
    for (lua_Integer k = 1; k <= len; k++) {
        lua_rawgeti(L, idx, k);
        int isint;
        const lua_Integer id = lua_tointegerx(L, -1, &isint);
        if (!isint || id < 0 || id >= n_vocab)
            luaL_error(L, "bad argument to '%s' (sequence %I: ids[%I] is not a token id in 0..%I)", fname, seq, k,
                       (lua_Integer)n_vocab - 1);
        ids[k - 1] = (int32_t)id;
        lua_pop(L, 1);
    }
    *n = len;
    return ids;
}

/* The sequence numbers of opts.sequences (default 1..count) into items[].index. */
static void item_indices(lua_State *L, lua_batch *lb, int opts, int64_t count, ember_batch_item *items,
                         const char *fname) {
    if (lua_istable(L, opts) && lua_getfield(L, opts, "sequences") != LUA_TNIL) {
        if (!lua_istable(L, -1) || (int64_t)lua_rawlen(L, -1) != count)
            luaL_error(L, "bad argument to '%s' (option 'sequences' must list one sequence number per input, %I)",
                       fname, (lua_Integer)count);
        for (int64_t k = 0; k < count; k++) {
            lua_rawgeti(L, -1, (lua_Integer)k + 1);
            items[k].index = check_seq(L, lb, luaL_checkinteger(L, -1), fname);
            lua_pop(L, 1);
        }
        lua_pop(L, 1);
        return;
    }
    if (lua_istable(L, opts)) lua_pop(L, 1);
    for (int64_t k = 0; k < count; k++) items[k].index = check_seq(L, lb, k + 1, fname);
}

/* The result: one logits tensor per item, in item order ([1, n_vocab], or [n, n_vocab] with all). */
static void push_results(lua_State *L, lua_batch *lb, const ember_batch_item *items, int64_t count, bool all) {
    const int64_t v = ember_model_get_info(lb->model->m)->n_vocab;
    lua_createtable(L, (int)count, 0);
    for (int64_t k = 0; k < count; k++) {
        const ember_session *s = ember_batch_session(lb->b, items[k].index);
        int64_t rows = 1;
        const float *src = all ? ember_session_all_logits(s, &rows) : ember_session_logits(s);
        ember_lua_tensor *t = ember_lua_push_tensor(L, rows, v);
        memcpy(t->data, src, (size_t)(rows * v) * sizeof(float));
        lua_rawseti(L, -2, (lua_Integer)k + 1);
    }
}

/* One evaluation: [self, inputs, opts]; decode: inputs are ids, else tables of ids. */
static int batch_eval(lua_State *L, bool decode, const char *fname) {
    static const char *const valid[] = {"experiment", "all_logits", "sequences", NULL};
    lua_batch *lb = check_batch(L, 1, fname);
    lua_settop(L, 3);
    luaL_checktype(L, 2, LUA_TTABLE);
    if (!lua_isnil(L, 3)) {
        luaL_checktype(L, 3, LUA_TTABLE);
        ember_lua_check_options(L, 3, fname, valid);
    }
    const int64_t count = (int64_t)lua_rawlen(L, 2), v = ember_model_get_info(lb->model->m)->n_vocab;
    if (count < 1) return luaL_error(L, "bad argument to '%s' (no sequences to evaluate)", fname);
    ember_batch_item *items = lua_newuserdatauv(L, (size_t)count * sizeof *items, 0); /* [.., items] */
    item_indices(L, lb, 3, count, items, fname);
    int32_t *one = decode ? lua_newuserdatauv(L, (size_t)count * sizeof *one, 0) : NULL;
    for (int64_t k = 0; k < count; k++) {
        lua_rawgeti(L, 2, (lua_Integer)k + 1);
        if (decode) {
            int isint;
            const lua_Integer id = lua_tointegerx(L, -1, &isint);
            if (!isint || id < 0 || id >= v)
                return luaL_error(L, "bad argument to '%s' (ids[%I] is not a token id in 0..%I)", fname,
                                  (lua_Integer)k + 1, (lua_Integer)v - 1);
            one[k] = (int32_t)id;
            items[k].ids = &one[k], items[k].n = 1;
            lua_pop(L, 1);
        } else {
            items[k].ids = read_ids(L, -1, v, fname, items[k].index + 1, &items[k].n);
            lua_remove(L, -2); /* the buffer stays on the stack */
        }
    }
    ember_lua_runner *r = NULL;
    if (lua_istable(L, 3) && lua_getfield(L, 3, "experiment") != LUA_TNIL) {
        lua_getiuservalue(L, 1, 1);
        r = ember_lua_runner_attach(L, -2, -1, fname); /* [.., exp, model, runner] */
    }
    bool all = false;
    if (lua_istable(L, 3)) {
        lua_getfield(L, 3, "all_logits");
        all = lua_toboolean(L, -1) && !decode;
        lua_pop(L, 1);
    }
    for (int64_t k = 0; k < count; k++) ember_session_set_all_logits(ember_batch_session(lb->b, items[k].index), all);
    ember_error err = {0};
    lb->busy = true;
    lua_State *outer = ember_lua_running;
    ember_lua_running = L;
    const ember_status st = ember_batch_eval(lb->b, decode ? EMBER_PHASE_DECODE : EMBER_PHASE_PREFILL, items, count,
                                             r ? ember_lua_runner_hooks(L, r) : NULL, &err);
    ember_lua_running = outer;
    lb->busy = false;
    if (st == EMBER_OK) push_results(L, lb, items, count, all);
    for (int64_t k = 0; k < count; k++) ember_session_set_all_logits(ember_batch_session(lb->b, items[k].index), false);
    if (st != EMBER_OK) {
        if (r && ember_lua_runner_failed(r)) return ember_lua_runner_raise(L, r);
        return luaL_error(L, "%s: %s", fname, err.msg);
    }
    return 1;
}

/* b:prefill({ids1, ids2, ...} [, {experiment=, all_logits=, sequences=}]) -> {logits1, ...} */
static int b_prefill(lua_State *L) { return batch_eval(L, false, "prefill"); }

/* b:decode({id1, id2, ...} [, {experiment=, sequences=}]) -> {logits1, ...} */
static int b_decode(lua_State *L) { return batch_eval(L, true, "decode"); }

/* b:position(i) -> sequence i's position */
static int b_position(lua_State *L) {
    lua_batch *lb = check_batch(L, 1, "position");
    const int64_t i = check_seq(L, lb, luaL_checkinteger(L, 2), "position");
    lua_pushinteger(L, ember_session_position(ember_batch_session(lb->b, i)));
    return 1;
}

/* b:logits(i) -> sequence i's current logits [1, n_vocab], or nil before its first evaluation */
static int b_logits(lua_State *L) {
    lua_batch *lb = check_batch(L, 1, "logits");
    const int64_t i = check_seq(L, lb, luaL_checkinteger(L, 2), "logits");
    const float *logits = ember_session_logits(ember_batch_session(lb->b, i));
    if (!logits) {
        lua_pushnil(L);
        return 1;
    }
    const int64_t v = ember_model_get_info(lb->model->m)->n_vocab;
    ember_lua_tensor *t = ember_lua_push_tensor(L, 1, v);
    memcpy(t->data, logits, (size_t)v * sizeof(float));
    return 1;
}

/* b:reset([i]): sequence i (or every sequence) back to position 0 */
static int b_reset(lua_State *L) {
    lua_batch *lb = check_batch(L, 1, "reset");
    if (!lua_isnoneornil(L, 2)) {
        ember_session_reset(ember_batch_session(lb->b, check_seq(L, lb, luaL_checkinteger(L, 2), "reset")));
        return 0;
    }
    for (int64_t i = 0; i < ember_batch_size(lb->b); i++) ember_session_reset(ember_batch_session(lb->b, i));
    return 0;
}

/* b:rewind(i, p): sequence i back to position p (0 <= p <= its position), keeping its cache of 0..p-1 */
static int b_rewind(lua_State *L) {
    lua_batch *lb = check_batch(L, 1, "rewind");
    const int64_t i = check_seq(L, lb, luaL_checkinteger(L, 2), "rewind");
    const lua_Integer p = luaL_checkinteger(L, 3);
    ember_error err = {0};
    if (ember_session_rewind(ember_batch_session(lb->b, i), (int64_t)p, &err) != EMBER_OK)
        return luaL_error(L, "rewind: sequence %I: %s", (lua_Integer)(i + 1), err.msg);
    return 0;
}

static int b_close(lua_State *L) {
    lua_batch *lb = luaL_checkudata(L, 1, EMBER_LUA_BATCH);
    if (lb->busy) return luaL_error(L, "close: the batch is busy (it cannot be closed from inside its own evaluation)");
    batch_free(lb);
    return 0;
}

static int b_get_size(lua_State *L) {
    lua_batch *lb = luaL_checkudata(L, 1, EMBER_LUA_BATCH);
    if (!lb->b) return luaL_error(L, BATCH_CLOSED_MSG);
    lua_pushinteger(L, ember_batch_size(lb->b));
    return 1;
}

static int b_get_context(lua_State *L) {
    lua_batch *lb = luaL_checkudata(L, 1, EMBER_LUA_BATCH);
    if (!lb->b) return luaL_error(L, BATCH_CLOSED_MSG);
    lua_pushinteger(L, ember_session_context(ember_batch_session(lb->b, 0)));
    return 1;
}

static int b_get_closed(lua_State *L) {
    lua_pushboolean(L, ((lua_batch *)luaL_checkudata(L, 1, EMBER_LUA_BATCH))->b == NULL);
    return 1;
}

static int b_tostring(lua_State *L) {
    lua_batch *lb = luaL_checkudata(L, 1, EMBER_LUA_BATCH);
    if (!lb->b) lua_pushliteral(L, "ember.Batch (closed)");
    else
        lua_pushfstring(L, "ember.Batch(%I sequences of %I positions)", (lua_Integer)ember_batch_size(lb->b),
                        (lua_Integer)ember_session_context(ember_batch_session(lb->b, 0)));
    return 1;
}

void ember_lua_open_batch(lua_State *L, int module) {
    (void)module;
    static const luaL_Reg methods[] = {{"prefill", b_prefill}, {"decode", b_decode}, {"position", b_position},
                                       {"logits", b_logits},   {"reset", b_reset},   {"rewind", b_rewind},
                                       {"close", b_close},     {NULL, NULL}};
    static const luaL_Reg meta[] = {{"__gc", b_close}, {"__close", b_close}, {"__tostring", b_tostring}, {NULL, NULL}};
    static const luaL_Reg getters[] = {
        {"size", b_get_size}, {"context", b_get_context}, {"closed", b_get_closed}, {NULL, NULL}};
    ember_lua_new_class(L, EMBER_LUA_BATCH, methods, meta, getters);
    lua_pop(L, 1);
    luaL_getmetatable(L, EMBER_LUA_MODEL); /* model:batch */
    lua_getfield(L, -1, "__methods");
    lua_pushcfunction(L, m_batch);
    lua_setfield(L, -2, "batch");
    lua_pop(L, 2);
}
