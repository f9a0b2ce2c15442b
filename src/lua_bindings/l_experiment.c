/* l_experiment.c — the adapter between an experiment table (Lua hook methods) and the engine's C
 * hook table, plus ember.Context (read-only hook contexts). Wires only the methods a table defines;
 * never lets a Lua error unwind through engine frames: every call into Lua from a hook is one
 * lua_pcall, and failures travel back as EMBER_ERR_HOOK. */
#include "lbind.h"

#include <stdio.h>
#include <string.h>

/* Hook names indexed by ember_stage, then ember_lua_hook. */
static const char *const hook_names[EMBER_HOOK_COUNT + 1] = {
    "before_layer", "after_attention", "after_mlp", "after_layer", "before_logits", "after_logits",
    "on_model_loaded", "before_prefill", "on_generation_complete", NULL,
};

/* Slots of the anchor table: the Lua values a runner needs, reachable from the registry. */
enum {
    SLOT_EXP = 1,   /* the experiment table (self of every method) */
    SLOT_NAME,      /* its name */
    SLOT_MODEL_CTX, /* the model context, built once */
    SLOT_VIEW,      /* the view of the call in progress: keeps it alive until it is expired */
    SLOT_ERR,       /* the failing hook's error message */
    SLOT_FN,        /* SLOT_FN + hook: the method, or false */
    SLOT_COUNT = SLOT_FN + EMBER_HOOK_COUNT - 1
};

struct ember_lua_runner {
    lua_State *L;
    int anchor_ref;        /* registry reference to the anchor table */
    ember_hooks hooks;     /* on_tensor set only for stages the experiment defines */
    bool has_tensor_hooks;
    bool defined[EMBER_HOOK_COUNT];
    bool modified;         /* a view was written during this run */
    bool failed;
    int fail_hook;
    ember_phase fail_phase;
    int64_t fail_layer;
};

static int runner_gc(lua_State *L);

/* ---- contexts ---------------------------------------------------------------------------------- */

typedef enum { CTX_MODEL, CTX_EXEC, CTX_LAYER, CTX_GEN } ctx_kind;

/* A copy of what the engine reported, so a context never points at engine memory. The user
 * value is the model info table (CTX_MODEL) or the model context (the others). */
typedef struct {
    ctx_kind kind;
    int hook; /* the hook this context was made for; -1 for the model context */
    ember_eval_ctx ev;
    ember_lua_gen_counts counts;
} ctx_ud;

static const char *const ctx_kind_names[] = {"model", "execution", "layer", "generation"};

static ctx_ud *push_ctx(lua_State *L, ctx_kind kind, int hook) {
    ctx_ud *c = lua_newuserdatauv(L, sizeof *c, 1); /* [ctx] */
    memset(c, 0, sizeof *c);
    c->kind = kind;
    c->hook = hook;
    c->ev.layer_index = -1;
    luaL_setmetatable(L, EMBER_LUA_CONTEXT);
    return c;
}

static int ctx_token_position(lua_State *L) {
    ctx_ud *c = luaL_checkudata(L, 1, EMBER_LUA_CONTEXT);
    if ((c->kind == CTX_EXEC || c->kind == CTX_LAYER) && c->ev.input_token_count == 1)
        lua_pushinteger(L, c->ev.start_position);
    else
        lua_pushnil(L);
    return 1;
}

/* The model context's fields are read from model.info; "id" is the file's general.name. */
static int model_field(lua_State *L, const char *k) {
    static const char *const allowed[] = {"family", "architecture", "n_layers", "hidden_size", "n_vocab", NULL};
    lua_getiuservalue(L, 1, 1); /* [.., info] */
    if (strcmp(k, "id") == 0) {
        lua_getfield(L, -1, "name");
        return 1;
    }
    for (size_t i = 0; allowed[i]; i++)
        if (strcmp(k, allowed[i]) == 0) {
            lua_getfield(L, -1, k);
            return 1;
        }
    lua_pushnil(L);
    return 1;
}

static int ctx_index(lua_State *L) {
    ctx_ud *c = luaL_checkudata(L, 1, EMBER_LUA_CONTEXT);
    const char *k = lua_tostring(L, 2);
    if (!k || lua_type(L, 2) != LUA_TSTRING) {
        lua_pushnil(L);
        return 1;
    }
    if (strcmp(k, "kind") == 0) {
        lua_pushstring(L, ctx_kind_names[c->kind]);
        return 1;
    }
    if (strcmp(k, "model") == 0) {
        if (c->kind == CTX_MODEL) lua_pushvalue(L, 1);
        else lua_getiuservalue(L, 1, 1);
        return 1;
    }
    if (c->kind == CTX_MODEL) return model_field(L, k);
    if (strcmp(k, "hook") == 0) {
        lua_pushstring(L, hook_names[c->hook]);
        return 1;
    }
    if (strcmp(k, "tracing") == 0) {
        lua_pushstring(L, c->ev.tracing ? "enabled" : "disabled");
        return 1;
    }
    if (c->kind == CTX_GEN) {
        if (strcmp(k, "prompt_token_count") == 0) lua_pushinteger(L, c->counts.prompt_tokens);
        else if (strcmp(k, "generated_token_count") == 0) lua_pushinteger(L, c->counts.generated_tokens);
        else if (strcmp(k, "decode_count") == 0) lua_pushinteger(L, c->counts.decode_count);
        else lua_pushnil(L);
        return 1;
    }
    if (strcmp(k, "phase") == 0) lua_pushstring(L, c->ev.phase == EMBER_PHASE_PREFILL ? "prefill" : "decode");
    else if (strcmp(k, "start_position") == 0) lua_pushinteger(L, c->ev.start_position);
    else if (strcmp(k, "input_token_count") == 0) lua_pushinteger(L, c->ev.input_token_count);
    else if (strcmp(k, "sequence_length") == 0) lua_pushinteger(L, c->ev.sequence_length);
    else if (strcmp(k, "stage") == 0 && c->hook < EMBER_STAGE_COUNT) lua_pushstring(L, hook_names[c->hook]);
    else if (strcmp(k, "layer_index") == 0 && c->kind == CTX_LAYER) lua_pushinteger(L, c->ev.layer_index);
    else if (strcmp(k, "token_position") == 0) lua_pushcfunction(L, ctx_token_position);
    else lua_pushnil(L);
    return 1;
}

/* Contexts are read-only: an assignment is a bug in the experiment, so it raises. */
static int ctx_newindex(lua_State *L) {
    luaL_checkudata(L, 1, EMBER_LUA_CONTEXT);
    return luaL_error(L, "attempt to assign to read-only context field '%s' (hook contexts are read-only)",
                      luaL_tolstring(L, 2, NULL));
}

static int ctx_tostring(lua_State *L) {
    ctx_ud *c = luaL_checkudata(L, 1, EMBER_LUA_CONTEXT);
    if (c->kind == CTX_MODEL) {
        lua_getiuservalue(L, 1, 1);
        lua_getfield(L, -1, "family");
        lua_getfield(L, -2, "n_layers");
        lua_pushfstring(L, "ember.Context(model: %s, %I layers)", lua_tostring(L, -2),
                        (lua_Integer)lua_tointeger(L, -1));
    } else if (c->kind == CTX_GEN) {
        lua_pushfstring(L, "ember.Context(generation: prompt=%I, generated=%I, decodes=%I)",
                        (lua_Integer)c->counts.prompt_tokens, (lua_Integer)c->counts.generated_tokens,
                        (lua_Integer)c->counts.decode_count);
    } else {
        char layer[40] = "";
        if (c->kind == CTX_LAYER) snprintf(layer, sizeof layer, ", layer_index=%lld", (long long)c->ev.layer_index);
        lua_pushfstring(L, "ember.Context(%s: phase=%s, start_position=%I, input_token_count=%I%s)", hook_names[c->hook],
                        c->ev.phase == EMBER_PHASE_PREFILL ? "prefill" : "decode", (lua_Integer)c->ev.start_position,
                        (lua_Integer)c->ev.input_token_count, layer);
    }
    return 1;
}

void ember_lua_open_context(lua_State *L, int module) {
    static const luaL_Reg meta[] = {
        {"__index", ctx_index}, {"__newindex", ctx_newindex}, {"__tostring", ctx_tostring}, {NULL, NULL}};
    static const char *const fields[] = {
        "kind", "model", "hook", "stage", "phase", "start_position", "input_token_count", "sequence_length",
        "tracing", "layer_index", "family", "architecture", "n_layers", "hidden_size", "n_vocab", "id",
        "prompt_token_count", "generated_token_count", "decode_count", NULL};
    (void)module;
    luaL_newmetatable(L, EMBER_LUA_CONTEXT); /* [mt] */
    luaL_setfuncs(L, meta, 0);
    lua_newtable(L);
    lua_pushcfunction(L, ctx_token_position);
    lua_setfield(L, -2, "token_position");
    lua_setfield(L, -2, "__methods");
    /* Field names for completion: contexts resolve fields in C, so list them here. */
    lua_newtable(L);
    for (int i = 0; fields[i]; i++) {
        lua_pushstring(L, fields[i]);
        lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, "__fields");
    lua_pop(L, 1);

    luaL_newmetatable(L, EMBER_LUA_RUNNER); /* [mt] */
    lua_pushcfunction(L, runner_gc);
    lua_setfield(L, -2, "__gc");
    lua_pop(L, 1);
}

/* ---- calling hooks ----------------------------------------------------------------------------- */

typedef struct {
    ember_lua_runner *r;
    int hook;
    const ember_eval_ctx *ev;           /* tensor hooks and before_prefill */
    ember_view *view;                   /* tensor hooks */
    const ember_lua_gen_counts *counts; /* on_generation_complete */
    ember_lua_view *v;                  /* the view made for this call, expired afterwards */
} hook_call;

/* Message handler: turns any error value into a string (no traceback: the failure message format
 * is fixed, and the original message is what the experiment said). */
static int hook_msgh(lua_State *L) {
    if (lua_type(L, 1) == LUA_TSTRING) return 1;
    if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING) return 1;
    lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    return 1;
}

/* Runs under lua_pcall: builds the context (and view) and calls the method. [call] */
static int hook_trampoline(lua_State *L) {
    hook_call *c = lua_touserdata(L, 1);
    ember_lua_runner *r = c->r;
    lua_rawgeti(L, LUA_REGISTRYINDEX, r->anchor_ref); /* [call, anchor] */
    lua_rawgeti(L, 2, SLOT_FN + c->hook);             /* [call, anchor, fn] */
    lua_rawgeti(L, 2, SLOT_EXP);                      /* [call, anchor, fn, exp] */
    int nargs = 2;
    if (c->hook == EMBER_HOOK_ON_MODEL_LOADED) {
        lua_rawgeti(L, 2, SLOT_MODEL_CTX);
    } else if (c->hook == EMBER_HOOK_ON_GENERATION_COMPLETE) {
        ctx_ud *x = push_ctx(L, CTX_GEN, c->hook);
        x->counts = *c->counts;
        lua_rawgeti(L, 2, SLOT_MODEL_CTX);
        lua_setiuservalue(L, -2, 1);
    } else {
        bool per_layer = c->hook < EMBER_STAGE_BEFORE_LOGITS;
        ctx_ud *x = push_ctx(L, per_layer ? CTX_LAYER : CTX_EXEC, c->hook);
        x->ev = *c->ev;
        if (!per_layer) x->ev.layer_index = -1;
        lua_rawgeti(L, 2, SLOT_MODEL_CTX);
        lua_setiuservalue(L, -2, 1); /* [call, anchor, fn, exp, ctx] */
    }
    if (c->hook < EMBER_STAGE_COUNT) {
        c->v = ember_lua_push_view(L, c->view->data, c->view->rows, c->view->cols, &r->modified);
        lua_pushvalue(L, -1);
        lua_rawseti(L, 2, SLOT_VIEW); /* [call, anchor, fn, exp, ctx, view] */
        nargs = 3;
    }
    lua_call(L, nargs, 0);
    return 0;
}

/* One protected call into Lua. Pushes nothing that could raise outside the pcall: light C
 * functions and light userdata need no allocation, and the anchor slots already exist. */
static ember_status invoke(ember_lua_runner *r, hook_call *c, ember_error *err) {
    lua_State *L = r->L;
    if (r->failed) return EMBER_ERR_HOOK; /* no hook runs after a failure */
    if (!lua_checkstack(L, 8)) return ember_error_set(err, EMBER_ERR_NOMEM, "experiment hook: Lua stack overflow");
    int base = lua_gettop(L);
    lua_pushcfunction(L, hook_msgh);
    lua_pushcfunction(L, hook_trampoline);
    lua_pushlightuserdata(L, c);
    int st = lua_pcall(L, 1, 0, base + 1);
    if (c->v) ember_lua_expire_view(c->v); /* still reachable through SLOT_VIEW */
    if (st == LUA_OK) {
        lua_settop(L, base);
        return EMBER_OK;
    }
    r->failed = true;
    r->fail_hook = c->hook;
    r->fail_phase = c->ev ? c->ev->phase : EMBER_PHASE_PREFILL;
    r->fail_layer = c->ev ? c->ev->layer_index : -1;
    lua_rawgeti(L, LUA_REGISTRYINDEX, r->anchor_ref); /* [.., msgh, msg, anchor] */
    lua_pushvalue(L, -2);
    lua_rawseti(L, -2, SLOT_ERR);
    const char *msg = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : "(error object is not a string)";
    if (err) {
        err->code = EMBER_ERR_HOOK;
        snprintf(err->msg, sizeof err->msg, "%s failed: %s", hook_names[c->hook], msg);
    }
    lua_settop(L, base);
    return EMBER_ERR_HOOK;
}

static ember_status tensor_hook(void *user, ember_stage stage, const ember_eval_ctx *ctx, ember_view *view,
                                ember_error *err) {
    hook_call c = {.r = user, .hook = (int)stage, .ev = ctx, .view = view};
    return invoke(user, &c, err);
}

ember_status ember_lua_runner_lifecycle(lua_State *L, ember_lua_runner *r, ember_lua_hook hook,
                                        const ember_eval_ctx *ev, const ember_lua_gen_counts *counts) {
    if (!r->defined[hook]) return EMBER_OK;
    r->L = L;
    hook_call c = {.r = r, .hook = (int)hook, .ev = hook == EMBER_HOOK_BEFORE_PREFILL ? ev : NULL, .counts = counts};
    ember_error err;
    return invoke(r, &c, &err);
}

const ember_hooks *ember_lua_runner_hooks(ember_lua_runner *r) { return r->has_tensor_hooks ? &r->hooks : NULL; }
bool ember_lua_runner_modified(const ember_lua_runner *r) { return r->modified; }
bool ember_lua_runner_failed(const ember_lua_runner *r) { return r->failed; }

int ember_lua_runner_raise(lua_State *L, ember_lua_runner *r) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, r->anchor_ref); /* [anchor] */
    lua_rawgeti(L, -1, SLOT_NAME);                    /* [anchor, name] */
    lua_rawgeti(L, -2, SLOT_ERR);                     /* [anchor, name, msg] */
    const char *msg = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "(error object is not a string)";
    int h = r->fail_hook;
    bool has_phase = h < EMBER_STAGE_COUNT || h == EMBER_HOOK_BEFORE_PREFILL;
    bool has_layer = h < EMBER_STAGE_BEFORE_LOGITS;
    const char *phase = r->fail_phase == EMBER_PHASE_PREFILL ? "prefill" : "decode";
    if (has_layer)
        lua_pushfstring(L, "experiment '%s' failed in %s (phase=%s, layer=%I): %s", lua_tostring(L, -2),
                        hook_names[h], phase, (lua_Integer)r->fail_layer, msg);
    else if (has_phase)
        lua_pushfstring(L, "experiment '%s' failed in %s (phase=%s): %s", lua_tostring(L, -2), hook_names[h], phase, msg);
    else
        lua_pushfstring(L, "experiment '%s' failed in %s: %s", lua_tostring(L, -2), hook_names[h], msg);
    return lua_error(L);
}

/* ---- attaching --------------------------------------------------------------------------------- */

static bool is_hook_name(const char *k) {
    for (int i = 0; hook_names[i]; i++)
        if (strcmp(k, hook_names[i]) == 0) return true;
    return false;
}

static bool looks_like_hook(const char *k) {
    return strncmp(k, "before_", 7) == 0 || strncmp(k, "after_", 6) == 0 || strncmp(k, "on_", 3) == 0;
}

/* A function named like a hook but not one (after_mpl) would silently never run: refuse it.
 * Looks at the table and at the tables its metatables' __index chain leads to (class style). */
static void check_typos(lua_State *L, int exp, const char *name, const char *fname) {
    lua_pushvalue(L, exp); /* [t] */
    for (int depth = 0; depth < 16 && lua_type(L, -1) == LUA_TTABLE; depth++) {
        int t = lua_gettop(L);
        lua_pushnil(L);
        while (lua_next(L, t)) { /* [t, k, v] */
            if (lua_type(L, -2) == LUA_TSTRING && lua_isfunction(L, -1)) {
                const char *k = lua_tostring(L, -2);
                if (looks_like_hook(k) && !is_hook_name(k))
                    luaL_error(L, "%s: experiment '%s' defines '%s', which is not a hook (did you mean '%s'?)", fname,
                               name, k, ember_lua_closest(k, hook_names));
            }
            lua_pop(L, 1);
        }
        if (!lua_getmetatable(L, t)) break; /* [t, mt] */
        lua_getfield(L, -1, "__index");    /* [t, mt, index] */
        lua_replace(L, t);                 /* [index, mt] */
        lua_pop(L, 1);                     /* [index] */
    }
    lua_pop(L, 1);
}

static int runner_gc(lua_State *L) {
    ember_lua_runner *r = luaL_checkudata(L, 1, EMBER_LUA_RUNNER);
    if (r->anchor_ref != LUA_NOREF) luaL_unref(L, LUA_REGISTRYINDEX, r->anchor_ref);
    r->anchor_ref = LUA_NOREF;
    return 0;
}

ember_lua_runner *ember_lua_runner_attach(lua_State *L, int exp_idx, int model_idx, const char *fname) {
    exp_idx = lua_absindex(L, exp_idx);
    model_idx = lua_absindex(L, model_idx);
    if (!lua_istable(L, exp_idx))
        luaL_error(L, "bad argument to '%s' (experiment must be a table with a 'name' string, got %s)", fname,
                   luaL_typename(L, exp_idx));
    lua_getfield(L, exp_idx, "name"); /* [name] */
    size_t name_len = 0;
    const char *name = lua_type(L, -1) == LUA_TSTRING ? lua_tolstring(L, -1, &name_len) : NULL;
    if (!name || name_len == 0)
        luaL_error(L, "bad argument to '%s' (experiment needs a non-empty 'name' string, got %s)", fname,
                   luaL_typename(L, -1));
    check_typos(L, exp_idx, name, fname);
    int name_idx = lua_gettop(L);

    /* Everything is checked; now build. The runner userdata is GC-managed, so a raise below leaks
     * nothing (its __gc drops the anchor reference once it holds one). */
    ember_lua_runner *r = lua_newuserdatauv(L, sizeof *r, 0); /* [name, runner] */
    memset(r, 0, sizeof *r);
    r->anchor_ref = LUA_NOREF;
    r->L = L;
    r->hooks.user = r;
    luaL_setmetatable(L, EMBER_LUA_RUNNER);

    lua_createtable(L, SLOT_COUNT, 0); /* [name, runner, anchor] */
    for (int i = 1; i <= SLOT_COUNT; i++) {
        lua_pushboolean(L, 0); /* every slot exists, so later rawseti never allocates */
        lua_rawseti(L, -2, i);
    }
    lua_pushvalue(L, exp_idx);
    lua_rawseti(L, -2, SLOT_EXP);
    lua_pushvalue(L, name_idx);
    lua_rawseti(L, -2, SLOT_NAME);
    push_ctx(L, CTX_MODEL, -1);
    ember_lua_push_model_info(L, model_idx);
    lua_setiuservalue(L, -2, 1);
    lua_rawseti(L, -2, SLOT_MODEL_CTX);

    for (int h = 0; h < EMBER_HOOK_COUNT; h++) {
        int t = lua_getfield(L, exp_idx, hook_names[h]); /* [.., anchor, fn] */
        if (t == LUA_TNIL) {
            lua_pop(L, 1);
            continue;
        }
        bool callable = t == LUA_TFUNCTION;
        if (!callable && luaL_getmetafield(L, -1, "__call") != LUA_TNIL) {
            lua_pop(L, 1);
            callable = true;
        }
        if (!callable)
            luaL_error(L, "%s: experiment '%s': hook '%s' must be a function, got %s", fname, name, hook_names[h],
                       luaL_typename(L, -1));
        lua_rawseti(L, -2, SLOT_FN + h);
        r->defined[h] = true;
        if (h < EMBER_STAGE_COUNT) {
            r->hooks.on_tensor[h] = tensor_hook;
            r->has_tensor_hooks = true;
        }
    }
    r->anchor_ref = luaL_ref(L, LUA_REGISTRYINDEX); /* [name, runner] */
    lua_remove(L, name_idx);                        /* [runner] */
    return r;
}
