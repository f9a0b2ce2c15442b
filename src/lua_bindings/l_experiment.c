/* l_experiment.c — the adapter between an experiment table (Lua hook methods) and the engine's C
 * hook table, plus ember.Context (read-only hook contexts), the hook-name lists exported to Lua
 * and the typo checker. Wires only the methods a table defines; never lets a Lua error unwind
 * through engine frames: every call into Lua from a hook is one lua_pcall, and failures travel
 * back as EMBER_ERR_HOOK. A hook call allocates nothing: contexts and views are made once per
 * hook slot and re-armed on every call. */
#include "l_experiment.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "l_model.h"
#include "l_sae.h"
#include "l_tensor.h"

/* The lifecycle hooks of a generation, indexed by ember_lua_hook - EMBER_STAGE_COUNT. The tensor
 * hooks are the engine's stages and take their names from ember_stage_name. */
static const char *const lifecycle_names[EMBER_HOOK_COUNT - EMBER_STAGE_COUNT] = {"on_model_loaded", "before_prefill",
                                                                                  "on_generation_complete"};

static const char *hook_name(int h) {
    return h < EMBER_STAGE_COUNT ? ember_stage_name((ember_stage)h) : lifecycle_names[h - EMBER_STAGE_COUNT];
}

/* Every hook name, NULL-terminated, for ember_lua_closest. */
static void hook_name_list(const char *out[EMBER_HOOK_COUNT + 1]) {
    for (int h = 0; h < EMBER_HOOK_COUNT; h++) out[h] = hook_name(h);
    out[EMBER_HOOK_COUNT] = NULL;
}

/* A tensor hook called once per layer (the stage table's in_layer); lifecycle hooks are not. */
static bool is_layer_stage(int h) { return h < EMBER_STAGE_COUNT && ember_stage_get((ember_stage)h)->in_layer; }

/* Slots of the anchor table: the Lua values a runner needs, reachable from the registry. Every
 * slot exists from the start (false when empty), so storing into one never allocates. */
enum {
    SLOT_EXP = 1,                          /* the experiment table (self of every method) */
    SLOT_NAME,                             /* its name */
    SLOT_MODEL_CTX,                        /* the model context, built once */
    SLOT_ERR,                              /* the failing hook's error message */
    SLOT_VIEWS,                            /* one root view per (stage, layer) slot, made on first use; see view_slot */
    SLOT_SAES,                             /* the ember.SAESites spliced in (runner:set_saes), or false */
    SLOT_FN,                               /* SLOT_FN + hook: the method, or false */
    SLOT_CTX = SLOT_FN + EMBER_HOOK_COUNT, /* SLOT_CTX + hook: that hook's context, or false */
    SLOT_COUNT = SLOT_CTX + EMBER_HOOK_COUNT - 1
};

/* Counters a generation context reports. */
typedef struct {
    int64_t prompt_tokens, generated_tokens, decode_count;
} gen_counts;

struct ember_lua_runner {
    lua_State *L;      /* the thread evaluations run on (set for each evaluation) */
    int anchor_ref;    /* registry reference to the anchor table */
    ember_hooks hooks; /* on_tensor set only for stages the experiment defines */
    bool has_tensor_hooks;
    bool defined[EMBER_HOOK_COUNT];
    int64_t n_layers; /* sizes the view slots */
    /* SLOT_VIEWS index - 1 of each stage's first view slot: n_layers slots for a per-layer stage,
     * one for the others, in stage order */
    lua_Integer slot_base[EMBER_STAGE_COUNT];
    lua_Integer n_slots;    /* view slots in all */
    int depth;              /* hook calls in progress: a nested call gets its own context and view */
    bool modified;          /* a view was written during this run */
    int64_t modified_calls; /* tensor hook calls that wrote through their view (how often it acted) */
    bool failed;
    int fail_hook;
    ember_phase fail_phase;
    int64_t fail_layer;
    bool tracing;          /* the generation is traced: what the lifecycle contexts report (set_tracing) */
    ember_sae_sites *saes; /* the SAEs spliced into its evaluations (kept alive in SLOT_SAES), or NULL */
};

/* ---- contexts ---------------------------------------------------------------------------------- */

typedef enum { CTX_MODEL, CTX_EXEC, CTX_LAYER, CTX_GEN } ctx_kind;

/* A copy of what the engine reported, so a context never points at engine memory. The user
 * value is the model info table (CTX_MODEL) or the model context (the others). A hook's context
 * is reused: it describes the latest call of its hook. */
typedef struct {
    ctx_kind kind;
    int hook; /* the hook this context was made for; -1 for the model context */
    ember_eval_ctx ev;
    gen_counts counts;
} ctx_ud;

/* Strings a context hands out, kept in ctx_index's upvalue so reading a field never creates one. */
enum { STR_PREFILL = 1, STR_DECODE, STR_DISABLED, STR_ENABLED, STR_KIND = 10, STR_HOOK = 20 };
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

/* ctx:expert(row, slot) -> expert index (0-based), weight: an MoE layer's slot-th choice (1-based,
 * in descending router probability) for row `row` (1-based) of this call; nil outside MoE routing. */
static int ctx_expert(lua_State *L) {
    ctx_ud *c = luaL_checkudata(L, 1, EMBER_LUA_CONTEXT);
    const lua_Integer row = luaL_checkinteger(L, 2), slot = luaL_checkinteger(L, 3);
    const int64_t k = c->ev.n_experts_used;
    if (!c->ev.expert_ids || k < 1) return 0;
    if (row < 1 || row > c->ev.input_token_count || slot < 1 || slot > k)
        return luaL_error(L, "ctx:expert(%I, %I): row must be in 1..%I and slot in 1..%I", row, slot,
                          (lua_Integer)c->ev.input_token_count, (lua_Integer)k);
    const int64_t i = (row - 1) * k + (slot - 1);
    lua_pushinteger(L, c->ev.expert_ids[i]);
    lua_pushnumber(L, c->ev.expert_weights[i]);
    return 2;
}

static int ctx_token_position(lua_State *L) {
    ctx_ud *c = luaL_checkudata(L, 1, EMBER_LUA_CONTEXT);
    if ((c->kind == CTX_EXEC || c->kind == CTX_LAYER) && c->ev.input_token_count == 1)
        lua_pushinteger(L, c->ev.start_position);
    else lua_pushnil(L);
    return 1;
}

/* The model context's fields are read from model.info; "id" is the file's general.name. */
static int model_field(lua_State *L, const char *k) {
    static const char *const allowed[] = {"family",  "architecture", "n_layers",   "hidden_size",
                                          "n_vocab", "n_heads",      "n_kv_heads", NULL};
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

static void push_str(lua_State *L, int which) { lua_rawgeti(L, lua_upvalueindex(1), which); }

/* ctx.sequences: {index, first_row, length, start_position} per sequence of the call (index and
 * first_row 1-based), a new table on each read; nil outside the call or at a lifecycle hook. */
static void push_sequences(lua_State *L, const ember_eval_ctx *ev) {
    if (!ev->sequences) {
        lua_pushnil(L);
        return;
    }
    lua_createtable(L, (int)ev->n_sequences, 0);
    for (int64_t k = 0; k < ev->n_sequences; k++) {
        const ember_sequence *q = &ev->sequences[k];
        lua_createtable(L, 0, 4);
        lua_pushinteger(L, q->index + 1);
        lua_setfield(L, -2, "index");
        lua_pushinteger(L, q->first_row + 1);
        lua_setfield(L, -2, "first_row");
        lua_pushinteger(L, q->length);
        lua_setfield(L, -2, "length");
        lua_pushinteger(L, q->start_position);
        lua_setfield(L, -2, "start_position");
        lua_rawseti(L, -2, (lua_Integer)k + 1);
    }
}

/* upvalue 1: the strings table (STR_*). [ctx, key] */
static int ctx_index(lua_State *L) {
    ctx_ud *c = luaL_checkudata(L, 1, EMBER_LUA_CONTEXT);
    const char *k = lua_type(L, 2) == LUA_TSTRING ? lua_tostring(L, 2) : NULL;
    if (!k) {
        lua_pushnil(L);
        return 1;
    }
    if (strcmp(k, "kind") == 0) {
        push_str(L, STR_KIND + (int)c->kind);
        return 1;
    }
    if (strcmp(k, "model") == 0) {
        if (c->kind == CTX_MODEL) lua_pushvalue(L, 1);
        else lua_getiuservalue(L, 1, 1);
        return 1;
    }
    if (c->kind == CTX_MODEL) return model_field(L, k);
    if (strcmp(k, "hook") == 0) {
        push_str(L, STR_HOOK + c->hook);
        return 1;
    }
    if (strcmp(k, "tracing") == 0) {
        push_str(L, c->ev.tracing ? STR_ENABLED : STR_DISABLED);
        return 1;
    }
    if (c->kind == CTX_GEN) {
        if (strcmp(k, "prompt_token_count") == 0) lua_pushinteger(L, c->counts.prompt_tokens);
        else if (strcmp(k, "generated_token_count") == 0) lua_pushinteger(L, c->counts.generated_tokens);
        else if (strcmp(k, "decode_count") == 0) lua_pushinteger(L, c->counts.decode_count);
        else lua_pushnil(L);
        return 1;
    }
    if (strcmp(k, "phase") == 0) push_str(L, c->ev.phase == EMBER_PHASE_PREFILL ? STR_PREFILL : STR_DECODE);
    else if (strcmp(k, "start_position") == 0) lua_pushinteger(L, c->ev.start_position);
    else if (strcmp(k, "input_token_count") == 0) lua_pushinteger(L, c->ev.input_token_count);
    else if (strcmp(k, "sequence_length") == 0) lua_pushinteger(L, c->ev.sequence_length);
    else if (strcmp(k, "stage") == 0 && c->hook < EMBER_STAGE_COUNT) push_str(L, STR_HOOK + c->hook);
    else if (strcmp(k, "layer_index") == 0 && c->kind == CTX_LAYER) lua_pushinteger(L, c->ev.layer_index);
    else if (strcmp(k, "sae_index") == 0 && c->hook == EMBER_STAGE_SAE_FEATURES) lua_pushinteger(L, c->ev.sae_site);
    else if (strcmp(k, "token_position") == 0) lua_pushcfunction(L, ctx_token_position);
    else if (strcmp(k, "n_experts_used") == 0 && c->ev.n_experts_used > 0) lua_pushinteger(L, c->ev.n_experts_used);
    else if (strcmp(k, "expert") == 0) lua_pushcfunction(L, ctx_expert);
    else if (strcmp(k, "sequences") == 0) push_sequences(L, &c->ev);
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
        lua_pushfstring(L, "ember.Context(%s: phase=%s, start_position=%I, input_token_count=%I%s)", hook_name(c->hook),
                        c->ev.phase == EMBER_PHASE_PREFILL ? "prefill" : "decode", (lua_Integer)c->ev.start_position,
                        (lua_Integer)c->ev.input_token_count, layer);
    }
    return 1;
}

static void open_context(lua_State *L) {
    static const luaL_Reg meta[] = {{"__newindex", ctx_newindex}, {"__tostring", ctx_tostring}, {NULL, NULL}};
    static const char *const fields[] = {"kind",
                                         "model",
                                         "hook",
                                         "stage",
                                         "phase",
                                         "start_position",
                                         "input_token_count",
                                         "sequence_length",
                                         "tracing",
                                         "layer_index",
                                         "sae_index",
                                         "sequences",
                                         "family",
                                         "architecture",
                                         "n_layers",
                                         "hidden_size",
                                         "n_vocab",
                                         "n_heads",
                                         "n_kv_heads",
                                         "id",
                                         "prompt_token_count",
                                         "generated_token_count",
                                         "decode_count",
                                         NULL};
    luaL_newmetatable(L, EMBER_LUA_CONTEXT); /* [mt] */
    luaL_setfuncs(L, meta, 0);
    lua_newtable(L); /* [mt, strings] */
    static const struct {
        int at;
        const char *s;
    } strs[] = {{STR_PREFILL, "prefill"}, {STR_DECODE, "decode"}, {STR_DISABLED, "disabled"}, {STR_ENABLED, "enabled"}};
    for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++) {
        lua_pushstring(L, strs[i].s);
        lua_rawseti(L, -2, strs[i].at);
    }
    for (int i = 0; i < 4; i++) {
        lua_pushstring(L, ctx_kind_names[i]);
        lua_rawseti(L, -2, STR_KIND + i);
    }
    for (int h = 0; h < EMBER_HOOK_COUNT; h++) {
        lua_pushstring(L, hook_name(h));
        lua_rawseti(L, -2, STR_HOOK + h);
    }
    lua_pushcclosure(L, ctx_index, 1); /* [mt, __index] */
    lua_setfield(L, -2, "__index");
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
}

/* ---- calling hooks ----------------------------------------------------------------------------- */

typedef struct {
    ember_lua_runner *r;
    int hook;
    const ember_eval_ctx *ev; /* tensor hooks and before_prefill */
    ember_view *view;         /* tensor hooks */
    const gen_counts *counts; /* on_generation_complete */
    ember_lua_view *v;        /* the view armed for this call, expired afterwards */
    ctx_ud *x;                /* the context of this call: its routing and sequences cleared afterwards */
} hook_call;

/* Message handler: turns any error value into a string (no traceback: the failure message format
 * is fixed, and the original message is what the experiment said). */
static int hook_msgh(lua_State *L) {
    if (lua_type(L, 1) == LUA_TSTRING) return 1;
    if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING) return 1;
    lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    return 1;
}

/* Index in the SLOT_VIEWS table of the view of (stage, layer): a per-layer stage has one slot per
 * layer, the others one; 0 when there is no slot (a layer outside the model). */
static lua_Integer view_slot(const ember_lua_runner *r, int stage, int64_t layer) {
    if (!is_layer_stage(stage)) return r->slot_base[stage] + 1;
    return layer >= 0 && layer < r->n_layers ? r->slot_base[stage] + (lua_Integer)layer + 1 : 0;
}

/* Lays out the view slots of r's stages (slot_base, n_slots). */
static void lay_out_view_slots(ember_lua_runner *r) {
    r->n_slots = 0;
    for (int s = 0; s < EMBER_STAGE_COUNT; s++) {
        r->slot_base[s] = r->n_slots;
        r->n_slots += is_layer_stage(s) ? (lua_Integer)r->n_layers : 1;
    }
}

/* Pushes the context of c's hook, filled for this call: the hook's own (made on first use) or,
 * inside a nested call of the same runner, a fresh one so the outer call's stays intact. [anchor at 2] */
static void push_call_ctx(lua_State *L, hook_call *c) {
    ctx_ud *x = NULL;
    bool reuse = c->r->depth == 1;
    if (reuse && lua_rawgeti(L, 2, SLOT_CTX + c->hook) == LUA_TUSERDATA) {
        x = lua_touserdata(L, -1);
    } else {
        if (reuse) lua_pop(L, 1);
        bool gen = c->hook == EMBER_HOOK_ON_GENERATION_COMPLETE;
        x = push_ctx(L, gen ? CTX_GEN : is_layer_stage(c->hook) ? CTX_LAYER : CTX_EXEC, c->hook);
        lua_rawgeti(L, 2, SLOT_MODEL_CTX);
        lua_setiuservalue(L, -2, 1);
        if (reuse) {
            lua_pushvalue(L, -1);
            lua_rawseti(L, 2, SLOT_CTX + c->hook);
        }
    }
    c->x = x;
    if (c->counts) x->counts = *c->counts;
    if (c->ev) {
        x->ev = *c->ev;
        if (!is_layer_stage(c->hook)) x->ev.layer_index = -1;
    } else {
        x->ev.tracing = c->r->tracing; /* on_generation_complete */
    }
}

/* Pushes the view of this tensor hook call, armed over the engine's buffer: the slot's own root
 * view (made on first use), or a fresh one when there is no slot or the call is nested. */
static void push_call_view(lua_State *L, hook_call *c) {
    ember_lua_runner *r = c->r;
    lua_Integer slot = r->depth == 1 ? view_slot(r, c->hook, c->ev->layer_index) : 0;
    if (slot > 0) {
        lua_rawgeti(L, 2, SLOT_VIEWS);                   /* [.., views] */
        if (lua_rawgeti(L, -1, slot) == LUA_TUSERDATA) { /* [.., views, view] */
            c->v = lua_touserdata(L, -1);
            ember_lua_arm_view(c->v, c->view->data, c->view->rows, c->view->cols);
        } else {
            lua_pop(L, 1);
            c->v = ember_lua_push_view(L, c->view->data, c->view->rows, c->view->cols, &c->view->written);
            lua_pushvalue(L, -1);
            lua_rawseti(L, -3, slot);
        }
        lua_remove(L, -2); /* [.., view] */
    } else {
        c->v = ember_lua_push_view(L, c->view->data, c->view->rows, c->view->cols, &c->view->written);
    }
    /* Writes during this call mark the engine's view (a reused slot view is pointed at this
     * call's); tensor_hook passes them on to the run's flag. */
    c->v->modified = &c->view->written;
    /* The engine says how many heads the view holds; the stage table says how they are laid out
     * (the pattern's rows, the heads' columns), so v:head(h) needs no arguments. */
    const ember_stage_heads by = ember_stage_get((ember_stage)c->hook)->heads;
    c->v->n_heads = c->view->n_heads;
    c->v->sequences = c->ev->sequences;
    c->v->n_sequences = c->ev->n_sequences;
    c->v->one_row_each = ember_stage_get((ember_stage)c->hook)->rows == EMBER_ROWS_LAST;
    c->v->heads_by = c->view->n_heads == 0 || by == EMBER_HEADS_NONE ? EMBER_LUA_HEADS_NONE
                     : by == EMBER_HEADS_ROWS                        ? EMBER_LUA_HEADS_ROWS
                                                                     : EMBER_LUA_HEADS_COLUMNS;
}

/* Runs under lua_pcall: pushes the method, self, the context (and view) and calls. [call] */
static int hook_trampoline(lua_State *L) {
    hook_call *c = lua_touserdata(L, 1);
    lua_rawgeti(L, LUA_REGISTRYINDEX, c->r->anchor_ref); /* [call, anchor] */
    lua_rawgeti(L, 2, SLOT_FN + c->hook);                /* [call, anchor, fn] */
    lua_rawgeti(L, 2, SLOT_EXP);                         /* [call, anchor, fn, exp] */
    int nargs = 2;
    if (c->hook == EMBER_HOOK_ON_MODEL_LOADED) lua_rawgeti(L, 2, SLOT_MODEL_CTX);
    else push_call_ctx(L, c); /* [call, anchor, fn, exp, ctx] */
    if (c->hook < EMBER_STAGE_COUNT) {
        push_call_view(L, c); /* [call, anchor, fn, exp, ctx, view] */
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
    r->depth++;
    lua_State *outer = ember_lua_running; /* Ctrl-C arms its hook on the thread the hook runs in */
    ember_lua_running = L;
    int st = lua_pcall(L, 1, 0, base + 1);
    ember_lua_running = outer;
    r->depth--;
    if (c->v) ember_lua_expire_view(c->v); /* still reachable through its slot (or garbage) */
    if (c->x) {                            /* the routing lives in the engine's workspace only during the call */
        c->x->ev.n_experts_used = 0;
        c->x->ev.expert_ids = NULL;
        c->x->ev.expert_weights = NULL;
        c->x->ev.sequences = NULL; /* engine memory: ctx.sequences is read inside the call */
    }
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
        snprintf(err->msg, sizeof err->msg, "%s failed: %s", hook_name(c->hook), msg);
    }
    lua_settop(L, base);
    return EMBER_ERR_HOOK;
}

static ember_status tensor_hook(void *user, ember_stage stage, const ember_eval_ctx *ctx, ember_view *view,
                                ember_error *err) {
    ember_lua_runner *r = user;
    hook_call c = {.r = r, .hook = (int)stage, .ev = ctx, .view = view};
    /* the views write into r->modified: cleared for this call, then merged back */
    bool before = r->modified;
    r->modified = false;
    ember_status st = invoke(r, &c, err);
    if (view->written) r->modified = true; /* the pattern path mixes only a written view */
    if (r->modified) r->modified_calls++;
    r->modified = r->modified || before;
    return st;
}

const ember_hooks *ember_lua_runner_hooks(lua_State *L, ember_lua_runner *r) {
    r->L = L;
    return r->has_tensor_hooks || r->saes ? &r->hooks : NULL;
}

/* A view was written, or a splice changed a row of the pass. */
bool ember_lua_runner_modified(const ember_lua_runner *r) {
    if (r->modified) return true;
    for (int i = 0; r->saes && i < ember_sae_sites_count(r->saes); i++)
        if (ember_sae_sites_changed_rows(r->saes, i) > 0) return true;
    return false;
}
bool ember_lua_runner_failed(const ember_lua_runner *r) { return r->failed; }

/* Replaces the string at the top by a copy with each NUL byte written as \x00: the message is
 * formatted as a C string next, which would otherwise end at the first NUL ("a\0b" -> "a"). */
static void escape_nul(lua_State *L) {
    size_t len;
    const char *s = lua_tolstring(L, -1, &len);
    if (strlen(s) == len) return;
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    for (size_t i = 0; i < len; i++) {
        if (s[i] == '\0') luaL_addstring(&b, "\\x00");
        else luaL_addchar(&b, s[i]);
    }
    luaL_pushresult(&b); /* [.., msg, escaped] */
    lua_remove(L, -2);
}

int ember_lua_runner_raise(lua_State *L, ember_lua_runner *r) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, r->anchor_ref); /* [anchor] */
    lua_rawgeti(L, -1, SLOT_NAME);                    /* [anchor, name] */
    lua_rawgeti(L, -2, SLOT_ERR);                     /* [anchor, name, msg] */
    if (lua_type(L, -1) == LUA_TSTRING) escape_nul(L);
    const char *msg = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "(error object is not a string)";
    int h = r->fail_hook;
    bool has_phase = h < EMBER_STAGE_COUNT || h == EMBER_HOOK_BEFORE_PREFILL;
    const char *phase = r->fail_phase == EMBER_PHASE_PREFILL ? "prefill" : "decode";
    if (is_layer_stage(h))
        lua_pushfstring(L, "experiment '%s' failed in %s (phase=%s, layer=%I): %s", lua_tostring(L, -2), hook_name(h),
                        phase, (lua_Integer)r->fail_layer, msg);
    else if (has_phase)
        lua_pushfstring(L, "experiment '%s' failed in %s (phase=%s): %s", lua_tostring(L, -2), hook_name(h), phase,
                        msg);
    else lua_pushfstring(L, "experiment '%s' failed in %s: %s", lua_tostring(L, -2), hook_name(h), msg);
    return lua_error(L);
}

/* ---- the runner's Lua face: lifecycle calls (generate.lua drives them) -------------------------- */

ember_lua_runner *ember_lua_check_runner(lua_State *L, int i) { return luaL_checkudata(L, i, EMBER_LUA_RUNNER); }

/* Calls a lifecycle hook if the experiment defines it; raises the experiment's failure. */
static int lifecycle(lua_State *L, ember_lua_runner *r, hook_call *c) {
    if (!r->defined[c->hook]) return 0;
    r->L = L;
    ember_error err;
    if (invoke(r, c, &err) != EMBER_OK) return ember_lua_runner_raise(L, r);
    return 0;
}

void ember_lua_runner_on_model_loaded(lua_State *L, ember_lua_runner *r) {
    hook_call c = {.r = r, .hook = EMBER_HOOK_ON_MODEL_LOADED};
    lifecycle(L, r, &c);
}

void ember_lua_runner_before_prefill(lua_State *L, ember_lua_runner *r, int64_t n, int64_t start) {
    ember_eval_ctx ev = {.phase = EMBER_PHASE_PREFILL,
                         .start_position = start,
                         .input_token_count = n,
                         .sequence_length = start + n,
                         .layer_index = -1,
                         .tracing = r->tracing};
    hook_call c = {.r = r, .hook = EMBER_HOOK_BEFORE_PREFILL, .ev = &ev};
    lifecycle(L, r, &c);
}

/* runner:on_model_loaded() */
static int r_on_model_loaded(lua_State *L) {
    ember_lua_runner_on_model_loaded(L, ember_lua_check_runner(L, 1));
    return 0;
}

/* runner:before_prefill(n_prompt [, start_position = 0]) */
static int r_before_prefill(lua_State *L) {
    ember_lua_runner *r = ember_lua_check_runner(L, 1);
    lua_Integer n = luaL_checkinteger(L, 2), start = luaL_optinteger(L, 3, 0);
    ember_lua_runner_before_prefill(L, r, n, start);
    return 0;
}

/* runner:set_tracing(on): the generation this runner serves is traced, so before_prefill and
 * on_generation_complete report ctx.tracing = "enabled" (tensor hooks get it from the engine). */
static int r_set_tracing(lua_State *L) {
    ember_lua_check_runner(L, 1)->tracing = lua_toboolean(L, 2);
    return 0;
}

/* runner:on_generation_complete(prompt_tokens, generated_tokens, decode_count) */
static int r_on_generation_complete(lua_State *L) {
    ember_lua_runner *r = ember_lua_check_runner(L, 1);
    gen_counts n = {.prompt_tokens = luaL_checkinteger(L, 2),
                    .generated_tokens = luaL_checkinteger(L, 3),
                    .decode_count = luaL_checkinteger(L, 4)};
    hook_call c = {.r = r, .hook = EMBER_HOOK_ON_GENERATION_COMPLETE, .counts = &n};
    return lifecycle(L, r, &c);
}

static int r_get_modified(lua_State *L) {
    lua_pushboolean(L, ember_lua_runner_modified(ember_lua_check_runner(L, 1)));
    return 1;
}

/* runner:set_saes(sites | nil): the SAEs every later evaluation of this runner splices in */
static int r_set_saes(lua_State *L) {
    ember_lua_runner *r = ember_lua_check_runner(L, 1);
    ember_sae_sites *sites = lua_isnoneornil(L, 2) ? NULL : ember_lua_check_sae_sites(L, 2);
    lua_rawgeti(L, LUA_REGISTRYINDEX, r->anchor_ref); /* [runner, sites, anchor] */
    if (sites) lua_pushvalue(L, 2);
    else lua_pushboolean(L, 0);
    lua_rawseti(L, -2, SLOT_SAES);
    r->saes = sites;
    r->hooks.saes = sites;
    return 0;
}

static int r_get_modified_calls(lua_State *L) {
    lua_pushinteger(L, (lua_Integer)ember_lua_check_runner(L, 1)->modified_calls);
    return 1;
}

static int r_get_name(lua_State *L) {
    ember_lua_runner *r = ember_lua_check_runner(L, 1);
    lua_rawgeti(L, LUA_REGISTRYINDEX, r->anchor_ref);
    lua_rawgeti(L, -1, SLOT_NAME);
    return 1;
}

static int runner_gc(lua_State *L) {
    ember_lua_runner *r = luaL_checkudata(L, 1, EMBER_LUA_RUNNER);
    if (r->anchor_ref != LUA_NOREF) luaL_unref(L, LUA_REGISTRYINDEX, r->anchor_ref);
    r->anchor_ref = LUA_NOREF;
    return 0;
}

/* ---- attaching: the typo checker and the hook table -------------------------------------------- */

static bool is_hook_name(const char *k) {
    for (int h = 0; h < EMBER_HOOK_COUNT; h++)
        if (strcmp(k, hook_name(h)) == 0) return true;
    return false;
}

static bool looks_like_hook(const char *k) {
    return strncmp(k, "before_", 7) == 0 || strncmp(k, "after_", 6) == 0 || strncmp(k, "on_", 3) == 0;
}

/* A function, or a value whose metatable has __call. Leaves the stack as it was. */
static bool is_callable(lua_State *L, int i) {
    if (lua_isfunction(L, i)) return true;
    if (luaL_getmetafield(L, i, "__call") == LUA_TNIL) return false;
    lua_pop(L, 1);
    return true;
}

/* The farthest a field's name may be from a hook's, case and '_' aside, and still be taken for a
 * misspelling of it (a plural is 1; every hook name has 9 or more letters). */
#define NEAR_MISS 2

/* The hook k misspells (set by the caller's names list), or NULL: k is not a hook, is not a helper
 * (a leading '_'), and is a near miss of a hook name, or is a callable named like one (after_*). */
static const char *misspelt_hook(const char *k, bool callable, const char *const *names) {
    if (k[0] == '_' || is_hook_name(k)) return NULL;
    const char *near = ember_lua_closest(k, names);
    if (ember_lua_fold_distance(k, near) <= NEAR_MISS) return near;
    return callable && looks_like_hook(k) ? near : NULL;
}

/* The stage k is TransformerLens's name of (a short name, an alias or a hook, bare or as
 * blocks.L.<hook>), or -1; *layer is L when k carries one, else -1. */
static int tl_stage(const char *k, long *layer) {
    *layer = -1;
    if (strncmp(k, "blocks.", 7) == 0) {
        char *end;
        long l = strtol(k + 7, &end, 10);
        if (end > k + 7 && *end == '.' && l >= 0) {
            *layer = l;
            k = end + 1;
        }
    }
    for (int s = 0; s < EMBER_STAGE_COUNT; s++) {
        const ember_stage_info *d = ember_stage_get((ember_stage)s);
        if (!d->tl_hook || (*layer >= 0 && !d->in_layer)) continue;
        if (strcmp(k, d->tl_hook) == 0 || strcmp(k, d->tl_short) == 0) return s;
        for (const char *const *a = d->tl_aliases; a && *a; a++)
            if (strcmp(k, *a) == 0) return s;
    }
    return -1;
}

/* A method named as TransformerLens names a hook (resid_post, blocks.3.hook_resid_post) would
 * silently never run: experiment methods take ember's stage names. Raises naming the one to use. */
static void refuse_tl_name(lua_State *L, const char *k, const char *name, const char *fname) {
    long layer;
    int s = tl_stage(k, &layer);
    if (s < 0) return;
    const char *stage = ember_stage_name((ember_stage)s);
    if (layer >= 0)
        luaL_error(L,
                   "%s: experiment '%s' defines '%s', TransformerLens's name for layer %I's '%s': hooks take "
                   "ember's stage names (define %s and test ctx.layer_index == %I); a helper's name starts with '_'",
                   fname, name, k, (lua_Integer)layer, stage, stage, (lua_Integer)layer);
    luaL_error(L,
               "%s: experiment '%s' defines '%s', TransformerLens's name for the hook '%s': hooks take ember's "
               "stage names (define %s); a helper's name starts with '_'",
               fname, name, k, stage, stage);
}

/* A callable named like a hook but not one (after_mpl), or named as TransformerLens names one
 * (resid_post), would silently never run: refuse it. Looks at the table and at the tables its
 * metatables' __index chain leads to (class style). */
static void check_typos(lua_State *L, int exp, const char *name, const char *fname) {
    const char *names[EMBER_HOOK_COUNT + 1];
    hook_name_list(names);
    lua_pushvalue(L, exp); /* [t] */
    for (int depth = 0; depth < 16 && lua_type(L, -1) == LUA_TTABLE; depth++) {
        int t = lua_gettop(L);
        lua_pushnil(L);
        while (lua_next(L, t)) { /* [t, k, v] */
            const char *hook = NULL;
            if (lua_type(L, -2) == LUA_TSTRING) {
                bool callable = is_callable(L, -1);
                if (callable) refuse_tl_name(L, lua_tostring(L, -2), name, fname);
                hook = misspelt_hook(lua_tostring(L, -2), callable, names);
            }
            if (hook)
                luaL_error(L,
                           "%s: experiment '%s' defines '%s', which is not a hook (did you mean '%s'?); a helper's "
                           "name starts with '_'",
                           fname, name, lua_tostring(L, -2), hook);
            lua_pop(L, 1);
        }
        if (!lua_getmetatable(L, t)) break; /* [t, mt] */
        lua_getfield(L, -1, "__index");     /* [t, mt, index] */
        lua_replace(L, t);                  /* [index, mt] */
        lua_pop(L, 1);                      /* [index] */
    }
    lua_pop(L, 1);
}

/* Checks the experiment table at exp (a table, a non-empty name, no misspelt hook) and pushes its
 * name. Raises "bad argument to '<fname>' (...)" / "<fname>: experiment '<name>' ..." otherwise. */
static const char *check_experiment(lua_State *L, int exp, const char *fname) {
    if (!lua_istable(L, exp))
        luaL_error(L, "bad argument to '%s' (experiment must be a table with a 'name' string, got %s)", fname,
                   luaL_typename(L, exp));
    lua_getfield(L, exp, "name"); /* [name] */
    size_t name_len = 0;
    const char *name = lua_type(L, -1) == LUA_TSTRING ? lua_tolstring(L, -1, &name_len) : NULL;
    if (!name || name_len == 0)
        luaL_error(L, "bad argument to '%s' (experiment needs a non-empty 'name' string, got %s)", fname,
                   luaL_typename(L, -1));
    check_typos(L, exp, name, fname);
    return name;
}

/* Pushes exp[hook h] (inherited methods count) and returns true when the experiment defines it;
 * a defined hook that is not callable raises. Pushes nothing when it is absent. */
static bool push_hook(lua_State *L, int exp, int h, const char *name, const char *fname) {
    if (lua_getfield(L, exp, hook_name(h)) == LUA_TNIL) {
        lua_pop(L, 1);
        return false;
    }
    if (!is_callable(L, -1))
        luaL_error(L, "%s: experiment '%s': hook '%s' must be a function, got %s", fname, name, hook_name(h),
                   luaL_typename(L, -1));
    return true;
}

/* core.check_experiment(exp [, fname = "check_experiment"]) -> { hook = callable, ... }
 * The attach-time checks of one experiment, for code that forwards hooks itself (compose). */
static int l_check_experiment(lua_State *L) {
    const char *fname = luaL_optstring(L, 2, "check_experiment");
    lua_settop(L, 2);
    const char *name = check_experiment(L, 1, fname); /* [exp, fname, name] */
    lua_createtable(L, 0, EMBER_HOOK_COUNT);          /* [exp, fname, name, hooks] */
    for (int h = 0; h < EMBER_HOOK_COUNT; h++)
        if (push_hook(L, 1, h, name, fname)) lua_setfield(L, -2, hook_name(h));
    return 1;
}

/* A hook of a stage only some families have (moe_router) on a model of another family would never
 * run: refused, naming the stage and the families that have it. [info at info_idx] */
static void check_family_stages(lua_State *L, int exp_idx, const char *name, const char *fname, int info_idx) {
    lua_getfield(L, info_idx, "family");
    const char *family = lua_tostring(L, -1);
    for (int h = 0; h < EMBER_STAGE_COUNT; h++) {
        const ember_stage_info *d = ember_stage_get((ember_stage)h);
        if (!d->families) continue;
        bool has = false;
        for (const char *const *f = d->families; *f; f++) has = has || (family && strcmp(*f, family) == 0);
        if (has || lua_getfield(L, exp_idx, d->name) == LUA_TNIL) {
            if (!has) lua_pop(L, 1);
            continue;
        }
        luaL_error(L, "%s: experiment '%s' defines '%s', a stage only %s models have (this model is %s)", fname, name,
                   d->name, d->families[0], family ? family : "?");
    }
    lua_pop(L, 1);
}

ember_lua_runner *ember_lua_runner_attach(lua_State *L, int exp_idx, int model_idx, const char *fname) {
    exp_idx = lua_absindex(L, exp_idx);
    model_idx = lua_absindex(L, model_idx);
    const char *name = check_experiment(L, exp_idx, fname); /* [name] */
    int name_idx = lua_gettop(L);
    ember_lua_push_model_info(L, model_idx); /* [name, info] */
    lua_getfield(L, -1, "n_layers");
    int64_t n_layers = lua_tointeger(L, -1);
    lua_pop(L, 1);
    check_family_stages(L, exp_idx, name, fname, lua_gettop(L));

    /* Everything is checked; now build. The runner userdata is GC-managed, so a raise below leaks
     * nothing (its __gc drops the anchor reference once it holds one). */
    ember_lua_runner *r = lua_newuserdatauv(L, sizeof *r, 0); /* [name, info, runner] */
    memset(r, 0, sizeof *r);
    r->anchor_ref = LUA_NOREF;
    r->L = L;
    r->hooks.user = r;
    r->n_layers = n_layers > 0 ? n_layers : 0;
    luaL_setmetatable(L, EMBER_LUA_RUNNER);

    lua_createtable(L, SLOT_COUNT, 0); /* [name, info, runner, anchor] */
    for (int i = 1; i <= SLOT_COUNT; i++) {
        lua_pushboolean(L, 0);
        lua_rawseti(L, -2, i);
    }
    lua_pushvalue(L, exp_idx);
    lua_rawseti(L, -2, SLOT_EXP);
    lua_pushvalue(L, name_idx);
    lua_rawseti(L, -2, SLOT_NAME);
    push_ctx(L, CTX_MODEL, -1);
    lua_pushvalue(L, name_idx + 1);
    lua_setiuservalue(L, -2, 1);
    lua_rawseti(L, -2, SLOT_MODEL_CTX);
    lay_out_view_slots(r);
    lua_createtable(L, (int)r->n_slots, 0); /* the view slots, all present so filling one never allocates */
    for (lua_Integer i = 1; i <= r->n_slots; i++) {
        lua_pushboolean(L, 0);
        lua_rawseti(L, -2, i);
    }
    lua_rawseti(L, -2, SLOT_VIEWS);

    for (int h = 0; h < EMBER_HOOK_COUNT; h++) {
        if (!push_hook(L, exp_idx, h, name, fname)) continue; /* [.., anchor, fn] */
        lua_rawseti(L, -2, SLOT_FN + h);
        r->defined[h] = true;
        if (h < EMBER_STAGE_COUNT) {
            r->hooks.on_tensor[h] = tensor_hook;
            r->has_tensor_hooks = true;
        }
    }
    r->anchor_ref = luaL_ref(L, LUA_REGISTRYINDEX); /* [name, info, runner] */
    lua_replace(L, name_idx);                       /* [runner, info] */
    lua_pop(L, 1);                                  /* [runner] */
    return r;
}

/* core.internal.attach(exp, model [, fname = "attach"]) -> ember.ExperimentRunner */
static int l_attach(lua_State *L) {
    const char *fname = luaL_optstring(L, 3, "attach");
    luaL_checkudata(L, 2, EMBER_LUA_MODEL);
    ember_lua_runner_attach(L, 1, 2, fname);
    return 1;
}

/* ---- the name lists ------------------------------------------------------------------------------ */

/* Pushes an ordered list of names that is also a set: t[i] = name and t[name] = i. */
static void push_name_list(lua_State *L, const char *const *names, int n) {
    lua_createtable(L, n, n);
    for (int i = 0; i < n; i++) {
        lua_pushstring(L, names[i]);
        lua_rawseti(L, -2, i + 1);
        lua_pushinteger(L, i + 1);
        lua_setfield(L, -2, names[i]);
    }
}

/* The row's TransformerLens names, into the row at the top: tl_hook, tl_short, tl_aliases (a
 * list); none for a stage without a TransformerLens hook. */
static void push_tl_names(lua_State *L, const ember_stage_info *d) {
    if (!d->tl_hook) return;
    lua_pushstring(L, d->tl_hook);
    lua_setfield(L, -2, "tl_hook");
    lua_pushstring(L, d->tl_short);
    lua_setfield(L, -2, "tl_short");
    int n = 0;
    while (d->tl_aliases && d->tl_aliases[n]) n++;
    lua_createtable(L, n, 0);
    for (int i = 0; i < n; i++) {
        lua_pushstring(L, d->tl_aliases[i]);
        lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, "tl_aliases");
}

/* core.STAGES: the engine's stage table in its order, each row { name =, order =, in_layer =,
 * inside_block =, rows =, width =, heads =, sae_only =, families =, tl_hook =, tl_short =,
 * tl_aliases = } (families: a list that is also a set, or nil for every family; the tl_ names
 * TransformerLens's, nil without one), and each row also under its name (STAGES.after_mlp). */
static void push_stage_table(lua_State *L) {
    lua_createtable(L, EMBER_STAGE_COUNT, EMBER_STAGE_COUNT); /* [stages] */
    for (int s = 0; s < EMBER_STAGE_COUNT; s++) {
        const ember_stage_info *d = ember_stage_get((ember_stage)s);
        lua_createtable(L, 0, 8); /* [stages, row] */
        lua_pushstring(L, d->name);
        lua_setfield(L, -2, "name");
        lua_pushinteger(L, d->order);
        lua_setfield(L, -2, "order");
        lua_pushboolean(L, d->in_layer);
        lua_setfield(L, -2, "in_layer");
        lua_pushboolean(L, d->inside_block);
        lua_setfield(L, -2, "inside_block");
        lua_pushstring(L, ember_stage_rows_name(d->rows));
        lua_setfield(L, -2, "rows");
        lua_pushstring(L, ember_stage_width_name(d->width));
        lua_setfield(L, -2, "width");
        lua_pushstring(L, ember_stage_heads_name(d->heads));
        lua_setfield(L, -2, "heads");
        lua_pushboolean(L, d->sae_only);
        lua_setfield(L, -2, "sae_only");
        push_tl_names(L, d);
        if (d->families) {
            int n = 0;
            while (d->families[n]) n++;
            push_name_list(L, d->families, n);
            lua_setfield(L, -2, "families");
        }
        lua_pushvalue(L, -1);
        lua_setfield(L, -3, d->name);
        lua_rawseti(L, -2, s + 1); /* [stages] */
    }
}

/* core.stages (the engine's, in execution order), core.layer_stages (a pass's own called per
 * layer: sae_features is an SAE's), core.inside_stages (those inside a layer's attention or MLP
 * block), core.sae_stages (those only an SAE splice calls), all read from the stage table, and
 * core.hooks (every hook of a generation, in the order they are first called). */
static void push_name_lists(lua_State *L, int module) {
    const char *names[EMBER_HOOK_COUNT], *layer[EMBER_STAGE_COUNT], *inside[EMBER_STAGE_COUNT], *sae[EMBER_STAGE_COUNT];
    int n_layer = 0, n_inside = 0, n_sae = 0;
    for (int s = 0; s < EMBER_STAGE_COUNT; s++) {
        names[s] = ember_stage_name((ember_stage)s);
        if (is_layer_stage(s) && !ember_stage_sae((ember_stage)s)) layer[n_layer++] = names[s];
        if (ember_stage_inside_block((ember_stage)s)) inside[n_inside++] = names[s];
        if (ember_stage_sae((ember_stage)s)) sae[n_sae++] = names[s];
    }
    push_name_list(L, names, EMBER_STAGE_COUNT);
    lua_setfield(L, module, "stages");
    push_name_list(L, layer, n_layer);
    lua_setfield(L, module, "layer_stages");
    push_name_list(L, inside, n_inside);
    lua_setfield(L, module, "inside_stages");
    push_name_list(L, sae, n_sae);
    lua_setfield(L, module, "sae_stages");
    int n = 0;
    names[n++] = hook_name(EMBER_HOOK_ON_MODEL_LOADED);
    names[n++] = hook_name(EMBER_HOOK_BEFORE_PREFILL);
    for (int s = 0; s < EMBER_STAGE_COUNT; s++) names[n++] = hook_name(s);
    names[n++] = hook_name(EMBER_HOOK_ON_GENERATION_COMPLETE);
    push_name_list(L, names, n);
    lua_setfield(L, module, "hooks");
}

void ember_lua_open_experiment(lua_State *L, int module) {
    open_context(L);
    static const luaL_Reg methods[] = {{"on_model_loaded", r_on_model_loaded},
                                       {"before_prefill", r_before_prefill},
                                       {"set_tracing", r_set_tracing},
                                       {"on_generation_complete", r_on_generation_complete},
                                       {"set_saes", r_set_saes},
                                       {NULL, NULL}};
    static const luaL_Reg meta[] = {{"__gc", runner_gc}, {NULL, NULL}};
    static const luaL_Reg getters[] = {
        {"modified", r_get_modified}, {"modified_calls", r_get_modified_calls}, {"name", r_get_name}, {NULL, NULL}};
    ember_lua_new_class(L, EMBER_LUA_RUNNER, methods, meta, getters);
    lua_pop(L, 1);

    push_stage_table(L);
    lua_setfield(L, module, "STAGES");
    push_name_lists(L, module);
    lua_pushcfunction(L, l_check_experiment);
    lua_setfield(L, module, "check_experiment");
    static const luaL_Reg internal[] = {{"attach", l_attach}, {NULL, NULL}};
    ember_lua_set_internal(L, module, internal);
}
