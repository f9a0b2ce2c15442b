/* l_session.c — ember.Session (a KV cache over one model: prefill, decode, reset) and
 * model:generate, which runs prefill + sampled decode with an optional experiment attached.
 * C resources live in GC-managed userdata marked to-be-closed, so a raise never leaks them. */
#include "lbind.h"

#include <string.h>

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
    ember_lua_session *ls = lua_newuserdatauv(L, sizeof *ls, 1); /* [session] */
    ls->s = NULL;
    ls->model = lm;
    ls->busy = false;
    luaL_setmetatable(L, EMBER_LUA_SESSION);
    lua_pushvalue(L, model_idx);
    lua_setiuservalue(L, -2, 1); /* the session keeps its model alive */
    ember_error err = {0};
    if (ember_session_new(lm->m, n_ctx, &ls->s, &err) != EMBER_OK) luaL_error(L, "%s: %s", fname, err.msg);
    lm->n_sessions++;
    return ls;
}

/* An open session that is not in the middle of an evaluation. */
static ember_lua_session *check_session(lua_State *L, int i, const char *fname) {
    ember_lua_session *ls = luaL_checkudata(L, i, EMBER_LUA_SESSION);
    if (!ls->s) luaL_error(L, SESSION_CLOSED_MSG);
    if (ls->model->closed) luaL_error(L, "%s: attempt to use a session of a closed model", fname);
    if (ls->busy)
        luaL_error(L, "%s: the session is busy (a hook or callback cannot re-enter the session it is running in)", fname);
    return ls;
}

/* Reads a table of token ids into a GC-managed int32 buffer pushed on the stack; every id is
 * checked against the vocabulary first, so the engine only ever sees valid ids. */
static int32_t *read_ids(lua_State *L, int idx, int64_t n_vocab, const char *fname, const char *what, int64_t *n_out) {
    idx = lua_absindex(L, idx);
    if (!lua_istable(L, idx))
        luaL_error(L, "bad argument to '%s' (%s must be a table of token ids, got %s)", fname, what, luaL_typename(L, idx));
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

/* Raises for a failed evaluation: the experiment's own message when a hook failed. */
static int eval_error(lua_State *L, ember_lua_runner *r, const char *fname, const ember_error *err) {
    if (r && ember_lua_runner_failed(r)) return ember_lua_runner_raise(L, r);
    return luaL_error(L, "%s: %s", fname, err->msg);
}

/* Optional {experiment = exp} of s:prefill / s:decode: only tensor hooks run there (the
 * lifecycle hooks belong to a generation). Pushes a runner (or nothing) and returns it. */
static ember_lua_runner *eval_runner(lua_State *L, int opts, const char *fname) {
    static const char *const valid[] = {"experiment", NULL};
    if (lua_isnoneornil(L, opts)) return NULL;
    luaL_checktype(L, opts, LUA_TTABLE);
    ember_lua_check_options(L, opts, fname, valid);
    if (lua_getfield(L, opts, "experiment") == LUA_TNIL) {
        lua_pop(L, 1);
        return NULL;
    }
    lua_getiuservalue(L, 1, 1); /* [exp, model] */
    ember_lua_runner *r = ember_lua_runner_attach(L, -2, -1, fname); /* [exp, model, runner] */
    return r;
}

/* s:prefill(ids [, {experiment=}]) -> Tensor [1, n_vocab] (a copy of the last position's logits) */
static int s_prefill(lua_State *L) {
    ember_lua_session *ls = check_session(L, 1, "prefill");
    lua_settop(L, 3); /* [self, ids, opts] then scratch */
    int64_t n_vocab = ember_model_get_info(ls->model->m)->n_vocab, n;
    int32_t *ids = read_ids(L, 2, n_vocab, "prefill", "ids", &n);
    ember_lua_runner *r = eval_runner(L, 3, "prefill");
    ember_error err = {0};
    ls->busy = true;
    ember_status st = ember_session_prefill(ls->s, ids, n, r ? ember_lua_runner_hooks(r) : NULL, &err);
    ls->busy = false;
    if (st != EMBER_OK) return eval_error(L, r, "prefill", &err);
    push_logits(L, ls->s, n_vocab);
    return 1;
}

/* s:decode(id [, {experiment=}]) -> Tensor [1, n_vocab] */
static int s_decode(lua_State *L) {
    ember_lua_session *ls = check_session(L, 1, "decode");
    lua_settop(L, 3);
    int64_t n_vocab = ember_model_get_info(ls->model->m)->n_vocab;
    lua_Integer id = luaL_checkinteger(L, 2);
    if (id < 0 || id >= n_vocab)
        return luaL_error(L, "bad argument #1 to 'decode' (token id %I is outside the vocabulary 0..%I)", id,
                          (lua_Integer)n_vocab - 1);
    ember_lua_runner *r = eval_runner(L, 3, "decode");
    ember_error err = {0};
    ls->busy = true;
    ember_status st = ember_session_decode(ls->s, (int32_t)id, r ? ember_lua_runner_hooks(r) : NULL, &err);
    ls->busy = false;
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

static int s_close(lua_State *L) {
    ember_lua_session *ls = luaL_checkudata(L, 1, EMBER_LUA_SESSION);
    if (ls->busy) return luaL_error(L, "close: the session is busy (it cannot be closed from inside its own evaluation)");
    session_free(ls);
    return 0;
}

/* __gc never sees a busy session: an evaluating session is on the stack of its caller. */
static int s_gc(lua_State *L) {
    session_free(luaL_checkudata(L, 1, EMBER_LUA_SESSION));
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

/* ---- generation -------------------------------------------------------------------------------- */

typedef struct {
    lua_Integer max_tokens, top_k, n_ctx;
    lua_Number temperature, top_p;
    lua_Integer seed;
    lua_Integer eos; /* -1: no stop id */
    bool all_logits;
} gen_opts;

static void sampler_free(void *p) { ember_sampler_free(p); }

static void read_gen_opts(lua_State *L, gen_opts *o) {
    static const char *const valid[] = {"ids", "prompt", "bos", "max_tokens", "temperature", "top_k", "top_p", "seed",
                                        "experiment", "on_token", "context", "eos", "all_logits", NULL};
    const char *f = "generate";
    ember_lua_check_options(L, 2, f, valid);
    o->max_tokens = ember_lua_opt_int_field(L, 2, f, "max_tokens", 16);
    o->temperature = ember_lua_opt_num_field(L, 2, f, "temperature", 0);
    o->top_k = ember_lua_opt_int_field(L, 2, f, "top_k", 0);
    o->top_p = ember_lua_opt_num_field(L, 2, f, "top_p", 1);
    o->seed = ember_lua_opt_int_field(L, 2, f, "seed", 0);
    o->n_ctx = ember_lua_opt_int_field(L, 2, f, "context", 0);
    if (o->max_tokens < 0) luaL_error(L, "bad argument to 'generate' (max_tokens must be >= 0, got %I)", o->max_tokens);
    if (!(o->temperature >= 0))
        luaL_error(L, "bad argument to 'generate' (temperature must be >= 0, got %f)", o->temperature);
    if (o->top_k < 0) luaL_error(L, "bad argument to 'generate' (top_k must be >= 0, got %I)", o->top_k);
    if (!(o->top_p > 0 && o->top_p <= 1))
        luaL_error(L, "bad argument to 'generate' (top_p must be in (0, 1], got %f)", o->top_p);
    if (o->n_ctx < 0) luaL_error(L, "bad argument to 'generate' (context must be >= 0, got %I)", o->n_ctx);
    lua_getfield(L, 2, "all_logits");
    o->all_logits = lua_toboolean(L, -1);
    lua_getfield(L, 2, "on_token");
    if (!lua_isnil(L, -1) && !lua_isfunction(L, -1) && luaL_getmetafield(L, -1, "__call") == LUA_TNIL)
        luaL_error(L, "bad argument to 'generate' (on_token must be a function, got %s)", luaL_typename(L, -1));
    lua_pop(L, 2);
}

/* Pushes the prompt ids table: ids= as given, or prompt= through the model's tokenizer. */
static void push_prompt_ids(lua_State *L) {
    int has_ids = lua_getfield(L, 2, "ids") != LUA_TNIL;
    int has_prompt = lua_getfield(L, 2, "prompt") != LUA_TNIL; /* [ids, prompt] */
    if (has_ids == has_prompt)
        luaL_error(L, "bad argument to 'generate' (give exactly one of ids= (token ids) or prompt= (text))");
    if (has_ids) {
        lua_pop(L, 1);
        return;
    }
    if (lua_type(L, -1) != LUA_TSTRING)
        luaL_error(L, "bad argument to 'generate' (prompt must be a string, got %s)", luaL_typename(L, -1));
    ember_lua_model_need_tokenizer(L, 1, "generate"); /* [nil, prompt, tok] */
    lua_getfield(L, -1, "encode");                    /* [nil, prompt, tok, encode] */
    lua_insert(L, -2);                                /* [nil, prompt, encode, tok] */
    lua_pushvalue(L, -3);                             /* [nil, prompt, encode, tok, prompt] */
    if (lua_getfield(L, 2, "bos") != LUA_TNIL) {      /* {bos = ...} only when the caller chose */
        lua_createtable(L, 0, 1);
        lua_insert(L, -2);
        lua_setfield(L, -2, "bos");
        lua_call(L, 3, 1);
    } else {
        lua_pop(L, 1);
        lua_call(L, 2, 1);
    }                    /* [nil, prompt, ids] */
    lua_replace(L, -3); /* [ids, prompt] */
    lua_pop(L, 1);
}

/* Calls tok:<method>(arg) if the model has a tokenizer, else pushes nil. [.., arg] -> [.., result] */
static void tok_call(lua_State *L, int tok, const char *method) {
    if (lua_isnil(L, tok)) {
        lua_pop(L, 1);
        lua_pushnil(L);
        return;
    }
    lua_getfield(L, tok, method); /* [arg, fn] */
    lua_insert(L, -2);            /* [fn, arg] */
    lua_pushvalue(L, tok);
    lua_insert(L, -2); /* [fn, tok, arg] */
    lua_call(L, 2, 1);
}

static void set_num(lua_State *L, const char *k, double v) {
    lua_pushnumber(L, v);
    lua_setfield(L, -2, k);
}

/* model:generate{ids= | prompt=, max_tokens=16, temperature=0, top_k=0, top_p=1, seed=0,
 *                experiment=, on_token=, context=, eos=, all_logits=} -> out table
 * N generated tokens cost one prefill and N decode evaluations: each generated token is fed back
 * once, so every hook sees every token; the generation context reports both counts. */
int ember_lua_generate(lua_State *L) {
    ember_lua_model *lm = ember_lua_check_model(L, 1);
    luaL_checktype(L, 2, LUA_TTABLE);
    lua_settop(L, 2);
    gen_opts o;
    read_gen_opts(L, &o);
    const int64_t n_vocab = ember_model_get_info(lm->m)->n_vocab;

    push_prompt_ids(L); /* 3: prompt ids table */
    int64_t n_prompt;
    int32_t *ids = read_ids(L, 3, n_vocab, "generate", "ids", &n_prompt); /* 4: id buffer */
    ember_lua_model_push_tokenizer(L, 1); /* 5: tokenizer or nil */
    const int tok = 5;
    /* eos: explicit id, false for none, default the tokenizer's */
    o.eos = -1;
    int eos_t = lua_getfield(L, 2, "eos");
    if (eos_t == LUA_TNUMBER) {
        o.eos = ember_lua_opt_int_field(L, 2, "generate", "eos", -1);
    } else if (eos_t == LUA_TNIL && !lua_isnil(L, tok)) {
        lua_getfield(L, tok, "eos_id");
        if (lua_isinteger(L, -1)) o.eos = lua_tointeger(L, -1);
        lua_pop(L, 1);
    } else if (eos_t != LUA_TNIL && !(eos_t == LUA_TBOOLEAN && !lua_toboolean(L, -1))) {
        return luaL_error(L, "bad argument to 'generate' (eos must be a token id or false, got %s)", luaL_typename(L, -1));
    }
    lua_pop(L, 1);
    lua_getfield(L, 2, "on_token"); /* 6: on_token or nil */
    const int on_token = 6;

    /* Session and sampler are closed when this function returns or raises. */
    int64_t n_ctx = o.n_ctx > 0 ? o.n_ctx : n_prompt + (o.max_tokens > 0 ? o.max_tokens : 1);
    ember_lua_session *ls = ember_lua_new_session(L, 1, n_ctx, "generate"); /* 7 */
    lua_toclose(L, 7);
    void **sampler = ember_lua_box(L, sampler_free); /* 8 */
    lua_toclose(L, 8);
    ember_sampler_params sp = {.temperature = (float)o.temperature, .top_k = (int)o.top_k, .top_p = (float)o.top_p,
                               .seed = (uint64_t)o.seed};
    ember_error err = {0};
    if (ember_sampler_new(&sp, n_vocab, (ember_sampler **)sampler, &err) != EMBER_OK)
        return luaL_error(L, "generate: %s", err.msg);

    ember_lua_runner *r = NULL; /* 9: runner or nil */
    if (lua_getfield(L, 2, "experiment") != LUA_TNIL) {
        int exp = lua_gettop(L);
        r = ember_lua_runner_attach(L, exp, 1, "generate");
        lua_remove(L, exp);
    }
    const ember_hooks *hooks = r ? ember_lua_runner_hooks(r) : NULL;
    lua_newtable(L); /* 10: generated ids */
    lua_newtable(L); /* 11: all logits (when asked) */
    const int out_ids = 10, all = 11, stream = 12;
    /* 12: the tokenizer's streaming detokenizer, so on_token gets whole UTF-8 characters */
    if (!lua_isnil(L, on_token) && !lua_isnil(L, tok) && lua_getfield(L, tok, "stream") != LUA_TNIL) {
        lua_pushvalue(L, tok);
        lua_call(L, 1, 1);
    } else {
        lua_settop(L, 11);
        lua_pushnil(L);
    }

    ember_lua_gen_counts counts = {.prompt_tokens = n_prompt};
    ember_eval_ctx ev = {.phase = EMBER_PHASE_PREFILL, .input_token_count = n_prompt, .sequence_length = n_prompt,
                         .layer_index = -1};
    if (r && (ember_lua_runner_lifecycle(L, r, EMBER_HOOK_ON_MODEL_LOADED, NULL, NULL) != EMBER_OK ||
              ember_lua_runner_lifecycle(L, r, EMBER_HOOK_BEFORE_PREFILL, &ev, NULL) != EMBER_OK))
        return ember_lua_runner_raise(L, r);

    double t0 = ember_lua_now_ms();
    ls->busy = true;
    ember_status st = ember_session_prefill(ls->s, ids, n_prompt, hooks, &err);
    ls->busy = false;
    double prefill_ms = ember_lua_now_ms() - t0, decode_ms = 0;
    if (st != EMBER_OK) return eval_error(L, r, "generate", &err);

    const char *stop = "max_tokens";
    for (lua_Integer k = 0; k < o.max_tokens; k++) {
        /* Ctrl-C in ember-lua: stop between tokens. The host has also armed a Lua hook, which
         * raises "interrupted" as soon as this function returns; raising here as well would
         * make that hook fire inside the error handler. */
        if (ember_lua_interrupted) {
            ember_lua_interrupted = 0;
            stop = "interrupted";
            break;
        }
        const float *logits = ember_session_logits(ls->s);
        if (o.all_logits) {
            push_logits(L, ls->s, n_vocab);
            lua_rawseti(L, all, k + 1);
        }
        int32_t id = ember_sampler_sample(*sampler, logits);
        lua_pushinteger(L, id);
        lua_rawseti(L, out_ids, k + 1);
        counts.generated_tokens++;
        if (!lua_isnil(L, on_token)) {
            lua_pushvalue(L, on_token);
            lua_pushinteger(L, id);
            if (!lua_isnil(L, stream)) { /* the piece's text: stream:push(id) */
                lua_getfield(L, stream, "push");
                lua_pushvalue(L, stream);
                lua_pushinteger(L, id);
                lua_call(L, 2, 1);
            } else { /* tok:decode{id}, or nil without a tokenizer */
                lua_createtable(L, 1, 0);
                lua_pushinteger(L, id);
                lua_rawseti(L, -2, 1);
                tok_call(L, tok, "decode");
            }
            lua_call(L, 2, 1);
            bool go_on = !(lua_isboolean(L, -1) && !lua_toboolean(L, -1));
            lua_pop(L, 1);
            if (!go_on) {
                stop = "callback";
                break;
            }
        }
        /* Every generated token is evaluated once (SPEC §4.1: one decode evaluation per generated
         * token), the last one and an end-of-sequence token included, so hooks and captures see
         * the activations of every token the run produced. */
        t0 = ember_lua_now_ms();
        ls->busy = true;
        st = ember_session_decode(ls->s, id, hooks, &err);
        ls->busy = false;
        decode_ms += ember_lua_now_ms() - t0;
        if (st != EMBER_OK) return eval_error(L, r, "generate", &err);
        counts.decode_count++;
        if (id == o.eos) {
            stop = "eos";
            break;
        }
    }
    bool completed = strcmp(stop, "interrupted") != 0; /* an interrupted run is not a completed one */
    if (r && completed && ember_lua_runner_lifecycle(L, r, EMBER_HOOK_ON_GENERATION_COMPLETE, NULL, &counts) != EMBER_OK)
        return ember_lua_runner_raise(L, r);

    lua_createtable(L, 0, 10); /* the result */
    lua_createtable(L, (int)n_prompt, 0); /* a copy of what ran, not the caller's table */
    for (int64_t i = 0; i < n_prompt; i++) {
        lua_pushinteger(L, ids[i]);
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
    lua_setfield(L, -2, "prompt_ids");
    lua_pushvalue(L, out_ids);
    lua_setfield(L, -2, "ids");
    /* text: the generated ids without a final stop token */
    lua_Integer n_text = (lua_Integer)counts.generated_tokens - (strcmp(stop, "eos") == 0);
    lua_createtable(L, (int)n_text, 0);
    for (lua_Integer i = 1; i <= n_text; i++) {
        lua_rawgeti(L, out_ids, i);
        lua_rawseti(L, -2, i);
    }
    tok_call(L, tok, "decode");
    lua_setfield(L, -2, "text");
    lua_pushboolean(L, r && ember_lua_runner_modified(r));
    lua_setfield(L, -2, "modified");
    lua_pushstring(L, stop);
    lua_setfield(L, -2, "stop");
    push_logits(L, ls->s, n_vocab);
    lua_setfield(L, -2, "logits");
    if (o.all_logits) {
        lua_pushvalue(L, all);
        lua_setfield(L, -2, "all_logits");
    }
    lua_createtable(L, 0, 8);
    set_num(L, "prefill_ms", prefill_ms);
    set_num(L, "decode_ms", decode_ms);
    set_num(L, "prefill_tok_s", prefill_ms > 0 ? (double)n_prompt * 1e3 / prefill_ms : 0);
    set_num(L, "decode_tok_s", decode_ms > 0 ? (double)counts.decode_count * 1e3 / decode_ms : 0);
    lua_pushinteger(L, counts.prompt_tokens);
    lua_setfield(L, -2, "prompt_tokens");
    lua_pushinteger(L, counts.generated_tokens);
    lua_setfield(L, -2, "generated_tokens");
    lua_pushinteger(L, counts.decode_count);
    lua_setfield(L, -2, "decode_count");
    lua_setfield(L, -2, "stats");
    return 1; /* slots 7 and 8 are closed on return: KV cache and sampler freed now */
}

void ember_lua_open_session(lua_State *L, int module) {
    static const luaL_Reg methods[] = {
        {"prefill", s_prefill}, {"decode", s_decode}, {"logits", s_logits},
        {"reset", s_reset},     {"close", s_close},   {NULL, NULL}};
    static const luaL_Reg meta[] = {{"__gc", s_gc}, {"__close", s_close}, {"__tostring", s_tostring}, {NULL, NULL}};
    static const luaL_Reg getters[] = {{"position", s_get_position}, {"context", s_get_context},
                                       {"model", s_get_model},       {"closed", s_get_closed},
                                       {NULL, NULL}};
    (void)module;
    ember_lua_new_class(L, EMBER_LUA_SESSION, methods, meta, getters);
    lua_pop(L, 1);
}
