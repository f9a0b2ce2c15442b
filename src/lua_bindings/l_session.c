/* l_session.c — ember.Session (a KV cache over one model: prefill, decode, reset) and the one
 * evaluation primitive generation is built on (lib/ember/model/generate.lua holds the policy).
 * Never loops over tokens and never calls back into Lua except through an experiment's hooks. */
#include "l_session.h"

#include <string.h>

#include "l_experiment.h"
#include "l_sampler.h"
#include "l_tensor.h"
#include "l_trace.h"

#define SESSION_CLOSED_MSG "attempt to use a closed session"

static void session_free(ember_lua_session *ls) {
    if (!ls->s) return;
    ember_session_free(ls->s);
    ls->s = NULL;
    ember_lua_model_release(ls->model);
}

ember_lua_session *ember_lua_new_session(lua_State *L, int model_idx, int64_t n_ctx, const char *fname) {
    model_idx = lua_absindex(L, model_idx);
    ember_lua_model *lm = ember_lua_check_model(L, model_idx);
    /* user values: 1 the model, 2 the experiments that had on_model_loaded here (session_saw),
     * 3 the trace it writes into (l_trace.c) */
    ember_lua_session *ls = lua_newuserdatauv(L, sizeof *ls, 3); /* [session] */
    ls->s = NULL;
    ls->model = lm;
    ls->busy = false;
    luaL_setmetatable(L, EMBER_LUA_SESSION);
    lua_pushvalue(L, model_idx);
    lua_setiuservalue(L, -2, 1); /* the session keeps its model alive */
    ember_error err = {0};
    if (ember_session_new(lm->m, n_ctx, &ls->s, &err) != EMBER_OK) {
        /* the engine's message already starts "session: "; model:session adds nothing to it */
        if (strcmp(fname, "session") == 0 && strncmp(err.msg, "session: ", 9) == 0) luaL_error(L, "%s", err.msg);
        luaL_error(L, "%s: %s", fname, err.msg);
    }
    lm->n_sessions++;
    return ls;
}

/* Raises when the session is in the middle of an evaluation (a hook or callback re-entering it). */
static void refuse_busy(lua_State *L, const ember_lua_session *ls, const char *fname) {
    if (ls->busy)
        luaL_error(L, "%s: the session is busy (a hook or callback cannot re-enter the session it is running in)",
                   fname);
}

/* An open session of an open model that is not in the middle of an evaluation. */
static ember_lua_session *check_session(lua_State *L, int i, const char *fname) {
    ember_lua_session *ls = luaL_checkudata(L, i, EMBER_LUA_SESSION);
    if (!ls->s) luaL_error(L, SESSION_CLOSED_MSG);
    if (ls->model->closed) luaL_error(L, "%s: attempt to use a session of a closed model", fname);
    refuse_busy(L, ls, fname);
    return ls;
}

/* Reads a table of token ids into a GC-managed int32 buffer pushed on the stack; every id is
 * checked against the vocabulary first, so the engine only ever sees valid ids. */
static int32_t *read_ids(lua_State *L, int idx, int64_t n_vocab, const char *fname, const char *what, int64_t *n_out) {
    idx = lua_absindex(L, idx);
    if (!lua_istable(L, idx))
        luaL_error(L, "bad argument to '%s' (%s must be a table of token ids, got %s)", fname, what,
                   luaL_typename(L, idx));
    lua_Integer n = (lua_Integer)lua_rawlen(L, idx);
    if (n < 1) luaL_error(L, "bad argument to '%s' (%s is empty: at least one token id is needed)", fname, what);
    int32_t *ids = lua_newuserdatauv(L, (size_t)n * sizeof *ids, 0); /* [.., buffer] */
    for (lua_Integer i = 1; i <= n; i++) {
        lua_rawgeti(L, idx, i);
        int isint;
        lua_Integer id = lua_tointegerx(L, -1, &isint);
        if (!isint || lua_type(L, -1) != LUA_TNUMBER)
            luaL_error(L, "bad argument to '%s' (%s[%I] is %s, not an integer token id)", fname, what, i,
                       lua_type(L, -1) == LUA_TNUMBER ? "a non-integral number" : luaL_typename(L, -1));
        if (id < 0 || id >= n_vocab)
            luaL_error(L, "bad argument to '%s' (%s[%I] = %I is outside the vocabulary 0..%I)", fname, what, i, id,
                       (lua_Integer)n_vocab - 1);
        ids[i - 1] = (int32_t)id;
        lua_pop(L, 1);
    }
    *n_out = n;
    return ids;
}

static void push_logits(lua_State *L, const ember_session *s, int64_t n_vocab) {
    const float *logits = ember_session_logits(s);
    if (!logits) {
        lua_pushnil(L);
        return;
    }
    ember_lua_tensor *t = ember_lua_push_tensor(L, 1, n_vocab);
    memcpy(t->data, logits, (size_t)n_vocab * sizeof(float));
}

/* ---- the evaluation frame ---------------------------------------------------------------------- */

/* What every evaluation (s:prefill, s:decode, core.internal.evaluate) is framed by, set in one
 * place: the session busy (a hook or callback that re-enters it gets the busy error), the Lua
 * thread L published as the one running engine work (ember_lua_running: Ctrl-C arms its hook on
 * that thread, which may be a coroutine, so the interrupt is raised there as soon as it runs Lua
 * again), and the evaluation's own time. */
typedef struct {
    lua_State *outer; /* ember_lua_running before the frame (an outer evaluation's thread, or NULL) */
    double t0;
} eval_frame;

static void eval_begin(lua_State *L, ember_lua_session *ls, eval_frame *f) {
    ls->busy = true;
    f->outer = ember_lua_running;
    ember_lua_running = L;
    f->t0 = ember_lua_now_ms();
}

/* Ends the frame; returns the evaluation's milliseconds. (A Ctrl-C meanwhile armed L's hook: it
 * fires once L runs Lua.) */
static double eval_end(ember_lua_session *ls, const eval_frame *f) {
    const double ms = ember_lua_now_ms() - f->t0;
    ember_lua_running = f->outer;
    ls->busy = false;
    return ms;
}

/* Raises for a failed evaluation: the experiment's own message when a hook failed. */
static int eval_error(lua_State *L, ember_lua_runner *r, const char *fname, const ember_error *err) {
    if (r && ember_lua_runner_failed(r)) return ember_lua_runner_raise(L, r);
    return luaL_error(L, "%s: %s", fname, err->msg);
}

/* Whether the experiment at exp_idx has had on_model_loaded in this session; marks it when `mark`.
 * The set is the session's second user value, a table with weak keys made on first use, so a
 * session never keeps an experiment alive. */
static bool session_saw(lua_State *L, int exp_idx, bool mark) {
    exp_idx = lua_absindex(L, exp_idx);
    if (lua_getiuservalue(L, 1, 2) != LUA_TTABLE) { /* [set|nil] */
        lua_pop(L, 1);
        lua_newtable(L); /* [set] */
        lua_createtable(L, 0, 1);
        lua_pushliteral(L, "k");
        lua_setfield(L, -2, "__mode");
        lua_setmetatable(L, -2);
        lua_pushvalue(L, -1);
        lua_setiuservalue(L, 1, 2);
    }
    lua_pushvalue(L, exp_idx);
    bool seen = lua_rawget(L, -2) != LUA_TNIL; /* [set, seen] */
    lua_pop(L, 1);
    if (mark) {
        lua_pushvalue(L, exp_idx);
        lua_pushboolean(L, 1);
        lua_rawset(L, -3);
    }
    lua_pop(L, 1);
    return seen;
}

/* [runner, n_prefill, start, model_loaded]: one lifecycle call, under lua_pcall (session_lifecycle). */
static int lifecycle_call(lua_State *L) {
    ember_lua_runner *r = ember_lua_check_runner(L, 1);
    if (lua_toboolean(L, 4)) ember_lua_runner_on_model_loaded(L, r);
    else ember_lua_runner_before_prefill(L, r, lua_tointeger(L, 2), lua_tointeger(L, 3));
    return 0;
}

/* Runs a lifecycle hook of the runner at r_idx with the session busy (a hook that re-enters the
 * session gets the busy error, as during an evaluation), then clears busy and re-raises a failure. */
static void session_lifecycle(lua_State *L, ember_lua_session *ls, int r_idx, bool model_loaded, int64_t n) {
    r_idx = lua_absindex(L, r_idx);
    lua_pushcfunction(L, lifecycle_call);
    lua_pushvalue(L, r_idx);
    lua_pushinteger(L, n);
    lua_pushinteger(L, ember_session_position(ls->s));
    lua_pushboolean(L, model_loaded);
    ls->busy = true;
    int st = lua_pcall(L, 4, 0, 0);
    ls->busy = false;
    if (st != LUA_OK) lua_error(L);
}

/* Optional {experiment = exp} of s:prefill / s:decode. A session runs the lifecycle too: the
 * first evaluation with a given experiment calls its on_model_loaded, and every prefill calls
 * before_prefill (with that prefill's start position and token count) before the tensor hooks;
 * on_generation_complete belongs to generate alone (a session never knows it is finished).
 * n_prefill is the prefill's token count, 0 for a decode. Pushes a runner (or nothing). */
static ember_lua_runner *eval_runner(lua_State *L, ember_lua_session *ls, int opts, const char *fname,
                                     int64_t n_prefill) {
    static const char *const valid[] = {"experiment", "all_logits", NULL};
    if (lua_isnoneornil(L, opts)) return NULL;
    luaL_checktype(L, opts, LUA_TTABLE);
    ember_lua_check_options(L, opts, fname, valid);
    if (lua_getfield(L, opts, "experiment") == LUA_TNIL) {
        lua_pop(L, 1);
        return NULL;
    }
    lua_getiuservalue(L, 1, 1);                                      /* [exp, model] */
    ember_lua_runner *r = ember_lua_runner_attach(L, -2, -1, fname); /* [exp, model, runner] */
    /* marked only after it succeeded: a failed on_model_loaded is called again next time */
    if (!session_saw(L, -3, false)) {
        session_lifecycle(L, ls, -1, true, 0);
        session_saw(L, -3, true);
    }
    if (n_prefill > 0) session_lifecycle(L, ls, -1, false, n_prefill);
    return r;
}

/* The all_logits option of s:prefill / s:decode (checked by eval_runner's option list). */
static bool want_all_logits(lua_State *L, int opts) {
    if (!lua_istable(L, opts)) return false;
    lua_getfield(L, opts, "all_logits");
    bool on = lua_toboolean(L, -1);
    lua_pop(L, 1);
    return on;
}

/* The logits of every row of the last evaluation, as one [n, n_vocab] tensor. */
static void push_all_logits(lua_State *L, const ember_session *s, int64_t n_vocab) {
    int64_t rows;
    const float *all = ember_session_all_logits(s, &rows);
    if (!all) {
        lua_pushnil(L);
        return;
    }
    ember_lua_tensor *t = ember_lua_push_tensor(L, rows, n_vocab);
    memcpy(t->data, all, (size_t)rows * (size_t)n_vocab * sizeof(float));
}

/* s:prefill(ids [, {experiment=, all_logits=}]) -> Tensor [1, n_vocab] (a copy of the last
 * position's logits), or with all_logits = true [#ids, n_vocab] (every position's; the last row
 * is the default result bit for bit) */
static int s_prefill(lua_State *L) {
    ember_lua_session *ls = check_session(L, 1, "prefill");
    lua_settop(L, 3); /* [self, ids, opts] then scratch */
    int64_t n_vocab = ember_model_get_info(ls->model->m)->n_vocab, n;
    int32_t *ids = read_ids(L, 2, n_vocab, "prefill", "ids", &n);
    ember_lua_runner *r = eval_runner(L, ls, 3, "prefill", n);
    bool all = want_all_logits(L, 3);
    ember_error err = {0};
    eval_frame f;
    eval_begin(L, ls, &f);
    ember_session_set_all_logits(ls->s, all);
    ember_status st = ember_session_prefill(ls->s, ids, n, r ? ember_lua_runner_hooks(L, r) : NULL, &err);
    ember_session_set_all_logits(ls->s, false);
    eval_end(ls, &f);
    if (st != EMBER_OK) return eval_error(L, r, "prefill", &err);
    if (all) push_all_logits(L, ls->s, n_vocab);
    else push_logits(L, ls->s, n_vocab);
    return 1;
}

/* s:decode(id [, {experiment=, all_logits=}]) -> Tensor [1, n_vocab] (all_logits changes nothing:
 * a decode has one row) */
static int s_decode(lua_State *L) {
    ember_lua_session *ls = check_session(L, 1, "decode");
    lua_settop(L, 3);
    int64_t n_vocab = ember_model_get_info(ls->model->m)->n_vocab;
    lua_Integer id = luaL_checkinteger(L, 2);
    if (id < 0 || id >= n_vocab)
        return luaL_error(L, "bad argument #1 to 'decode' (token id %I is outside the vocabulary 0..%I)", id,
                          (lua_Integer)n_vocab - 1);
    ember_lua_runner *r = eval_runner(L, ls, 3, "decode", 0);
    ember_error err = {0};
    eval_frame f;
    eval_begin(L, ls, &f);
    ember_status st = ember_session_decode(ls->s, (int32_t)id, r ? ember_lua_runner_hooks(L, r) : NULL, &err);
    eval_end(ls, &f);
    if (st != EMBER_OK) return eval_error(L, r, "decode", &err);
    push_logits(L, ls->s, n_vocab);
    return 1;
}

/* s:logits() -> the current logits as a Tensor, or nil before the first evaluation */
static int s_logits(lua_State *L) {
    ember_lua_session *ls = check_session(L, 1, "logits");
    push_logits(L, ls->s, ember_model_get_info(ls->model->m)->n_vocab);
    return 1;
}

static int s_reset(lua_State *L) {
    ember_lua_session *ls = check_session(L, 1, "reset");
    ember_session_reset(ls->s);
    return 0;
}

/* s:rewind(p): back to position p (0 <= p <= s.position), keeping the cache of 0..p-1 */
static int s_rewind(lua_State *L) {
    ember_lua_session *ls = check_session(L, 1, "rewind");
    lua_Integer p = luaL_checkinteger(L, 2);
    ember_error err = {0};
    if (ember_session_rewind(ls->s, (int64_t)p, &err) != EMBER_OK) return luaL_error(L, "rewind: %s", err.msg);
    return 0;
}

static int s_close(lua_State *L) {
    ember_lua_session *ls = luaL_checkudata(L, 1, EMBER_LUA_SESSION);
    if (ls->busy)
        return luaL_error(L, "close: the session is busy (it cannot be closed from inside its own evaluation)");
    if (ls->s) ember_lua_trace_detach(L, 1);
    session_free(ls);
    return 0;
}

/* __gc never sees a busy session: an evaluating session is on the stack of its caller. */
static int s_gc(lua_State *L) {
    ember_lua_session *ls = luaL_checkudata(L, 1, EMBER_LUA_SESSION);
    if (ls->s) ember_lua_trace_detach(L, 1);
    session_free(ls);
    return 0;
}

static int s_get_position(lua_State *L) {
    ember_lua_session *ls = luaL_checkudata(L, 1, EMBER_LUA_SESSION);
    if (!ls->s) return luaL_error(L, SESSION_CLOSED_MSG);
    lua_pushinteger(L, ember_session_position(ls->s));
    return 1;
}

static int s_get_context(lua_State *L) {
    ember_lua_session *ls = luaL_checkudata(L, 1, EMBER_LUA_SESSION);
    if (!ls->s) return luaL_error(L, SESSION_CLOSED_MSG);
    lua_pushinteger(L, ember_session_context(ls->s));
    return 1;
}

static int s_get_model(lua_State *L) {
    luaL_checkudata(L, 1, EMBER_LUA_SESSION);
    lua_getiuservalue(L, 1, 1);
    return 1;
}

static int s_get_closed(lua_State *L) {
    ember_lua_session *ls = luaL_checkudata(L, 1, EMBER_LUA_SESSION);
    lua_pushboolean(L, ls->s == NULL);
    return 1;
}

static int s_tostring(lua_State *L) {
    ember_lua_session *ls = luaL_checkudata(L, 1, EMBER_LUA_SESSION);
    if (!ls->s) lua_pushliteral(L, "ember.Session (closed)");
    else
        lua_pushfstring(L, "ember.Session(position %I of %I%s)", (lua_Integer)ember_session_position(ls->s),
                        (lua_Integer)ember_session_context(ls->s), ls->busy ? ", busy" : "");
    return 1;
}

/* ---- the building blocks of generate (lib/ember/model/generate.lua) -------------------------- */

/* core.internal.session(model, n_ctx, fname) -> Session; errors name fname. */
static int l_new_session(lua_State *L) {
    lua_Integer n_ctx = luaL_checkinteger(L, 2);
    const char *fname = luaL_checkstring(L, 3);
    ember_lua_new_session(L, 1, n_ctx, fname);
    return 1;
}

/* core.internal.check_ids(ids, n_vocab, fname) -> a copy of ids, every entry an integer id inside
 * the vocabulary; raises naming fname otherwise. */
static int l_check_ids(lua_State *L) {
    lua_Integer n_vocab = luaL_checkinteger(L, 2);
    const char *fname = luaL_checkstring(L, 3);
    int64_t n;
    int32_t *ids = read_ids(L, 1, n_vocab, fname, "ids", &n); /* [ids, n_vocab, fname, buffer] */
    lua_createtable(L, (int)n, 0);
    for (int64_t i = 0; i < n; i++) {
        lua_pushinteger(L, ids[i]);
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
    return 1;
}

/* core.internal.evaluate(session, input, runner|nil, sampler|nil, fname) -> id, ms
 * One evaluation, the one C call a generated token costs: input is a table of ids (prefill) or
 * one id (decode); runner's tensor hooks run; then, with a sampler, the next id is drawn from the
 * new logits (false instead when the host's interrupt flag was raised meanwhile: the caller stops
 * between tokens). ms is the evaluation's own time. Unlike s:decode it does not refuse a session
 * whose model was closed meanwhile: the session keeps the engine model alive, and a generation
 * finishes what it started even if a hook closes the model. */
static int l_evaluate(lua_State *L) {
    const char *fname = luaL_checkstring(L, 5);
    ember_lua_session *ls = luaL_checkudata(L, 1, EMBER_LUA_SESSION);
    if (!ls->s) return luaL_error(L, SESSION_CLOSED_MSG);
    refuse_busy(L, ls, fname);
    ember_lua_runner *r = lua_isnil(L, 3) ? NULL : ember_lua_check_runner(L, 3);
    ember_sampler *smp = lua_isnil(L, 4) ? NULL : ember_lua_check_sampler(L, 4, NULL);
    const int64_t n_vocab = ember_model_get_info(ember_session_model(ls->s))->n_vocab;
    const ember_hooks *hooks = r ? ember_lua_runner_hooks(L, r) : NULL;
    ember_error err = {0};
    ember_status st;
    eval_frame f;
    if (lua_type(L, 2) == LUA_TNUMBER) {
        int isint;
        lua_Integer id = lua_tointegerx(L, 2, &isint);
        if (!isint || id < 0 || id >= n_vocab)
            return luaL_error(L, "bad argument to '%s' (token id %s is outside the vocabulary 0..%I)", fname,
                              luaL_tolstring(L, 2, NULL), (lua_Integer)n_vocab - 1);
        eval_begin(L, ls, &f);
        st = ember_session_decode(ls->s, (int32_t)id, hooks, &err);
    } else {
        int64_t n;
        int32_t *ids = read_ids(L, 2, n_vocab, fname, "ids", &n);
        eval_begin(L, ls, &f);
        st = ember_session_prefill(ls->s, ids, n, hooks, &err);
    }
    const double ms = eval_end(ls, &f);
    if (st != EMBER_OK) {
        if (r && ember_lua_runner_failed(r)) return ember_lua_runner_raise(L, r);
        /* no position: it would name generate.lua, not the code that asked for the generation */
        lua_pushfstring(L, "%s: %s", fname, err.msg);
        return lua_error(L);
    }
    if (!smp) {
        lua_pushnil(L);
    } else if (ember_lua_interrupted) {
        /* ember-lua has also armed a Lua hook that raises "interrupted" as soon as Lua runs again;
         * raising here as well would make that hook fire inside the error handler. */
        ember_lua_interrupted = 0;
        lua_pushboolean(L, 0);
    } else {
        lua_pushinteger(L, ember_sampler_sample(smp, ember_session_logits(ls->s)));
    }
    lua_pushnumber(L, ms);
    return 2;
}

/* core.internal.set_all_logits(session, on): ember_session_set_all_logits, for generate's prompt
 * logits; core.internal.all_logits(session) -> [n, n_vocab] of the last evaluation, or nil. */
static int l_set_all_logits(lua_State *L) {
    ember_lua_session *ls = luaL_checkudata(L, 1, EMBER_LUA_SESSION);
    if (!ls->s) return luaL_error(L, SESSION_CLOSED_MSG);
    ember_session_set_all_logits(ls->s, lua_toboolean(L, 2));
    return 0;
}

static int l_all_logits(lua_State *L) {
    ember_lua_session *ls = luaL_checkudata(L, 1, EMBER_LUA_SESSION);
    if (!ls->s) return luaL_error(L, SESSION_CLOSED_MSG);
    push_all_logits(L, ls->s, ember_model_get_info(ember_session_model(ls->s))->n_vocab);
    return 1;
}

/* core.internal.logits(session) -> the current logits (a copy) or nil; like evaluate, works
 * while the session is open even if its model was closed meanwhile. */
static int l_logits(lua_State *L) {
    ember_lua_session *ls = luaL_checkudata(L, 1, EMBER_LUA_SESSION);
    if (!ls->s) return luaL_error(L, SESSION_CLOSED_MSG);
    push_logits(L, ls->s, ember_model_get_info(ember_session_model(ls->s))->n_vocab);
    return 1;
}

void ember_lua_open_session(lua_State *L, int module) {
    static const luaL_Reg methods[] = {
        {"prefill", s_prefill}, {"decode", s_decode}, {"logits", s_logits}, {"reset", s_reset},
        {"rewind", s_rewind},   {"close", s_close},   {NULL, NULL}};
    static const luaL_Reg meta[] = {{"__gc", s_gc}, {"__close", s_close}, {"__tostring", s_tostring}, {NULL, NULL}};
    static const luaL_Reg getters[] = {{"position", s_get_position},
                                       {"context", s_get_context},
                                       {"model", s_get_model},
                                       {"closed", s_get_closed},
                                       {NULL, NULL}};
    static const luaL_Reg internal[] = {{"session", l_new_session},
                                        {"check_ids", l_check_ids},
                                        {"evaluate", l_evaluate},
                                        {"logits", l_logits},
                                        {"set_all_logits", l_set_all_logits},
                                        {"all_logits", l_all_logits},
                                        {NULL, NULL}};
    ember_lua_new_class(L, EMBER_LUA_SESSION, methods, meta, getters);
    lua_pop(L, 1);
    ember_lua_set_internal(L, module, internal);
}
