/* l_model.c — ember.Model: ember.load, model.info, the model's tokenizer, sessions, close
 * (model:generate is Lua: lib/ember/model/generate.lua, added to the class by lib/ember/init.lua).
 * The userdata starts closed and opens only once the engine model exists; sessions point into the
 * engine model, so it is freed only when it is closed and no session is left. */
#include "l_model.h"

#include <string.h>

#include "l_session.h"
#include "l_tokenizer.h"

/* User values of a model userdata. */
enum {
    UV_INFO = 1,         /* model.info, built once at load */
    UV_TOKENIZER,        /* the tokenizer; false once we know there is none; nil before the first look */
    UV_NO_TOKENIZER_WHY, /* why there is none (for the error of tokenize/generate{prompt=}) */
    UV_COUNT = UV_NO_TOKENIZER_WHY
};

static void free_if_unused(ember_lua_model *lm) {
    if (lm->closed && lm->n_sessions == 0 && lm->m) {
        ember_model_free(lm->m);
        lm->m = NULL;
    }
}

void ember_lua_model_release(ember_lua_model *lm) {
    lm->n_sessions--;
    free_if_unused(lm);
}

ember_lua_model *ember_lua_check_model(lua_State *L, int i) {
    ember_lua_model *lm = luaL_checkudata(L, i, EMBER_LUA_MODEL);
    if (lm->closed) luaL_error(L, "attempt to use a closed model");
    return lm;
}

void ember_lua_push_model_info(lua_State *L, int model_idx) { lua_getiuservalue(L, model_idx, UV_INFO); }

/* An optional boolean option of load's table at index 1. */
static bool opt_bool_field(lua_State *L, const char *key) {
    int t = lua_getfield(L, 1, key);
    if (t != LUA_TNIL && t != LUA_TBOOLEAN)
        luaL_error(L, "bad argument #1 to 'load' (option '%s' must be a boolean, got %s)", key, luaL_typename(L, -1));
    bool v = lua_toboolean(L, -1);
    lua_pop(L, 1);
    return v;
}

static void set_str(lua_State *L, const char *k, const char *v) {
    if (v) lua_pushstring(L, v);
    else lua_pushnil(L);
    lua_setfield(L, -2, k);
}

static void set_int(lua_State *L, const char *k, int64_t v) {
    lua_pushinteger(L, (lua_Integer)v);
    lua_setfield(L, -2, k);
}

static void push_info(lua_State *L, const ember_model *m, const char *path) {
    const ember_model_info *in = ember_model_get_info(m);
    lua_createtable(L, 0, 16);
    set_str(L, "family", in->family);
    set_str(L, "architecture", in->architecture);
    set_str(L, "name", in->name);
    set_int(L, "n_layers", in->n_layers);
    set_int(L, "hidden_size", in->hidden_size);
    set_int(L, "n_vocab", in->n_vocab);
    set_int(L, "n_heads", in->n_heads);
    set_int(L, "n_kv_heads", in->n_kv_heads);
    set_int(L, "head_dim", in->head_dim);
    set_int(L, "context_length", in->context_length);
    set_str(L, "dtype_summary", in->dtype_summary);
    set_str(L, "kernels", in->kernels);
    set_int(L, "threads", in->n_threads);
    lua_pushboolean(L, in->threads_default);
    lua_setfield(L, -2, "threads_default");
    set_int(L, "repacked_bytes", (lua_Integer)in->repacked_bytes);
    set_str(L, "kv_cache", in->kv_cache);
    set_str(L, "final_norm", in->final_norm);
    lua_pushnumber(L, (lua_Number)in->norm_eps);
    lua_setfield(L, -2, "norm_eps");
    lua_pushboolean(L, in->experimental);
    lua_setfield(L, -2, "experimental");
    set_str(L, "path", path);
    set_int(L, "weight_bytes_per_token", (int64_t)ember_model_weight_bytes_per_token(m));
    if (in->override_from) { /* override = { from = path, tensors = { names in the file's order } } */
        lua_createtable(L, 0, 2);
        set_str(L, "from", in->override_from);
        lua_createtable(L, (int)in->n_override, 0);
        for (int64_t i = 0; i < in->n_override; i++) {
            lua_pushstring(L, in->override_tensors[i]);
            lua_rawseti(L, -2, (lua_Integer)i + 1);
        }
        lua_setfield(L, -2, "tensors");
        lua_setfield(L, -2, "override");
    }
}

/* load's override = { from = A.gguf, tensors = { names } | "REGEX" } into p; the names stay on the
 * stack (a userdata holding the pointer array, and the strings in the caller's table at index 1). */
static void override_field(lua_State *L, ember_model_params *p) {
    if (lua_getfield(L, 1, "override") == LUA_TNIL) { /* [.., override] */
        lua_pop(L, 1);
        return;
    }
    if (!lua_istable(L, -1))
        luaL_error(L, "bad argument #1 to 'load' (option 'override' must be a table { from =, tensors = }, got %s)",
                   luaL_typename(L, -1));
    static const char *const valid[] = {"from", "tensors", NULL};
    ember_lua_check_options(L, lua_gettop(L), "load{override}", valid);
    int o = lua_gettop(L);
    p->override_from = ember_lua_opt_str_field(L, o, "load{override}", "from", NULL);
    if (!p->override_from) luaL_error(L, "bad argument #1 to 'load' (option 'override' needs from = the GGUF path)");
    int t = lua_getfield(L, o, "tensors"); /* [.., override, tensors] */
    if (t == LUA_TSTRING) {
        p->override_regex = lua_tostring(L, -1);
        return; /* the string stays on the stack */
    }
    if (t != LUA_TTABLE || lua_rawlen(L, -1) == 0)
        luaL_error(L, "bad argument #1 to 'load' (option 'override' needs tensors = a non-empty list of tensor "
                      "names or a regex string)");
    lua_Integer n = (lua_Integer)lua_rawlen(L, -1);
    const char **names = lua_newuserdatauv(L, (size_t)(n + 1) * sizeof *names, 0); /* [.., tensors, names] */
    for (lua_Integer i = 1; i <= n; i++) {
        if (lua_rawgeti(L, -2, i) != LUA_TSTRING)
            luaL_error(L, "bad argument #1 to 'load' (override tensors[%I] must be a tensor name, got %s)", i,
                       luaL_typename(L, -1));
        names[i - 1] = lua_tostring(L, -1); /* kept alive by the tensors table */
        lua_pop(L, 1);
    }
    names[n] = NULL;
    p->override_tensors = names;
}

/* ember.load{model=, arch=, kernels=, threads=, provenance=, verify_model=} or ember.load(path).
 * (tokenizer= is handled by lib/ember/init.lua, which builds the tokenizer and attaches it with
 * set_tokenizer.) provenance=true starts the file's digest before the weights are read, so it
 * overlaps loading and generation; verify_model=true also refuses the digest cache. */
static int l_load(lua_State *L) {
    static const char *const valid[] = {"model",      "arch",         "kernels",  "threads",  "allow_nonfinite",
                                        "provenance", "verify_model", "kv_cache", "override", NULL};
    ember_model_params p = {0};
    const char *kernels = "auto";
    bool provenance = false, verify = false;
    if (lua_type(L, 1) == LUA_TSTRING) {
        p.path = lua_tostring(L, 1);
    } else {
        luaL_argexpected(L, lua_istable(L, 1), 1, "table of options or model path");
        ember_lua_check_options(L, 1, "load", valid);
        p.path = ember_lua_opt_str_field(L, 1, "load", "model", NULL);
        if (!p.path) return luaL_error(L, "bad argument #1 to 'load' (option 'model' (the GGUF path) is required)");
        p.arch = ember_lua_opt_str_field(L, 1, "load", "arch", NULL);
        kernels = ember_lua_opt_str_field(L, 1, "load", "kernels", "auto");
        lua_Integer threads = ember_lua_opt_int_field(L, 1, "load", "threads", 0);
        if (threads < 0 || threads > 4096)
            return luaL_error(L, "bad argument #1 to 'load' (option 'threads' must be in 0..4096, got %I)", threads);
        p.n_threads = (int)threads;
        int t = lua_getfield(L, 1, "allow_nonfinite"); /* [.., v] */
        if (t != LUA_TNIL && t != LUA_TBOOLEAN)
            return luaL_error(L, "bad argument #1 to 'load' (option 'allow_nonfinite' must be a boolean, got %s)",
                              lua_typename(L, t));
        p.allow_nonfinite = lua_toboolean(L, -1);
        lua_pop(L, 1);
        const char *kv = ember_lua_opt_str_field(L, 1, "load", "kv_cache", "f32");
        if (!ember_kv_type_parse(kv, &p.kv_cache))
            return luaL_error(L, "bad argument #1 to 'load' (option 'kv_cache' must be f32, f16 or bf16, got '%s')",
                              kv);
        provenance = opt_bool_field(L, "provenance");
        verify = opt_bool_field(L, "verify_model");
        override_field(L, &p);
    }
    if (!ember_kernels_parse(kernels, &p.kernels))
        return luaL_error(
            L, "bad argument #1 to 'load' (option 'kernels' must be auto, reference, avx2 or avx512, got '%s')",
            kernels);

    ember_lua_model *lm = lua_newuserdatauv(L, sizeof *lm, UV_COUNT); /* [.., model] */
    lm->m = NULL;
    lm->closed = true; /* until the engine model exists */
    lm->n_sessions = 0;
    lm->digest = NULL;
    lm->verify_model = verify;
    luaL_setmetatable(L, EMBER_LUA_MODEL);
    ember_error err = {0};
    /* A file that cannot be opened fails the load just below with the loader's own message. */
    if (provenance || verify) (void)ember_digest_start(p.path, NULL, verify, &lm->digest, NULL);
    if (ember_model_load(&p, &lm->m, &err) != EMBER_OK) return luaL_error(L, "load: %s", err.msg);
    lm->closed = false;
    push_info(L, lm->m, p.path);
    lua_setiuservalue(L, -2, UV_INFO);
    return 1;
}

/* Pushes the model's tokenizer, or nil (with the reason in *why, when asked) when it has none.
 * The first look tries the vocabulary embedded in the GGUF; the answer is kept. */
static void push_tokenizer(lua_State *L, int idx, ember_lua_model *lm) {
    idx = lua_absindex(L, idx);
    if (lua_getiuservalue(L, idx, UV_TOKENIZER) != LUA_TNIL) { /* [tok|false] */
        if (!lua_toboolean(L, -1)) {
            lua_pop(L, 1);
            lua_pushnil(L);
        }
        return;
    }
    lua_pop(L, 1);
    ember_tokenizer *t = NULL;
    ember_error err = {0};
    if (ember_tokenizer_from_gguf(ember_model_gguf(lm->m), &t, &err) == EMBER_OK) {
        ember_lua_push_tokenizer(L, t); /* [tok] takes ownership of t */
        lua_pushvalue(L, -1);
        lua_setiuservalue(L, idx, UV_TOKENIZER);
        return;
    }
    lua_pushstring(L, err.msg);
    lua_setiuservalue(L, idx, UV_NO_TOKENIZER_WHY);
    lua_pushboolean(L, 0);
    lua_setiuservalue(L, idx, UV_TOKENIZER);
    lua_pushnil(L);
}

/* model.tokenizer -> the tokenizer or nil */
static int m_get_tokenizer(lua_State *L) {
    ember_lua_model *lm = ember_lua_check_model(L, 1);
    push_tokenizer(L, 1, lm);
    return 1;
}

void ember_lua_model_need_tokenizer(lua_State *L, int idx, const char *fname) {
    ember_lua_model *lm = ember_lua_check_model(L, idx);
    push_tokenizer(L, idx, lm);
    if (!lua_isnil(L, -1)) return;
    lua_getiuservalue(L, idx, UV_NO_TOKENIZER_WHY);
    luaL_error(L, "%s: the model has no tokenizer (%s); pass tokenizer= to ember.load", fname,
               lua_isstring(L, -1) ? lua_tostring(L, -1) : "none attached");
}

/* core.internal.need_tokenizer(model, fname) -> the model's tokenizer, or raises naming fname. */
static int l_need_tokenizer(lua_State *L) {
    const char *fname = luaL_checkstring(L, 2);
    ember_lua_model_need_tokenizer(L, 1, fname);
    return 1;
}

/* model:set_tokenizer(tok): any object with encode/decode methods (ember.Tokenizer normally). */
static int m_set_tokenizer(lua_State *L) {
    ember_lua_check_model(L, 1);
    if (lua_isnil(L, 2)) {
        lua_pushboolean(L, 0);
        lua_setiuservalue(L, 1, UV_TOKENIZER);
        lua_pushliteral(L, "removed with set_tokenizer(nil)");
        lua_setiuservalue(L, 1, UV_NO_TOKENIZER_WHY);
        return 0;
    }
    lua_getfield(L, 2, "encode");
    lua_getfield(L, 2, "decode");
    if (lua_isnil(L, -1) || lua_isnil(L, -2)) luaL_typeerror(L, 2, "tokenizer (with encode and decode methods)");
    lua_settop(L, 2);
    lua_setiuservalue(L, 1, UV_TOKENIZER);
    return 0;
}

/* model:tokenize(text [, opts]) and model:detokenize(ids): the tokenizer's encode/decode. */
static int delegate(lua_State *L, const char *fname, const char *method) {
    int n = lua_gettop(L);
    ember_lua_model_need_tokenizer(L, 1, fname); /* [self, args..., tok] */
    lua_getfield(L, -1, method);                 /* [self, args..., tok, fn] */
    lua_insert(L, -2);                           /* [self, args..., fn, tok] */
    for (int i = 2; i <= n; i++) lua_pushvalue(L, i);
    lua_call(L, n, 1);
    return 1;
}

static int m_tokenize(lua_State *L) {
    luaL_checkstring(L, 2);
    return delegate(L, "tokenize", "encode");
}

static int m_detokenize(lua_State *L) {
    luaL_checktype(L, 2, LUA_TTABLE);
    return delegate(L, "detokenize", "decode");
}

static int m_get_info(lua_State *L) {
    ember_lua_check_model(L, 1);
    lua_getiuservalue(L, 1, UV_INFO);
    return 1;
}

static int m_get_closed(lua_State *L) {
    ember_lua_model *lm = luaL_checkudata(L, 1, EMBER_LUA_MODEL);
    lua_pushboolean(L, lm->closed);
    return 1;
}

/* model:session{context=N} */
static int m_session(lua_State *L) {
    static const char *const valid[] = {"context", NULL};
    ember_lua_check_model(L, 1);
    lua_Integer n_ctx = 0;
    if (!lua_isnoneornil(L, 2)) {
        luaL_checktype(L, 2, LUA_TTABLE);
        ember_lua_check_options(L, 2, "session", valid);
        n_ctx = ember_lua_opt_int_field(L, 2, "session", "context", 0);
        if (n_ctx < 0)
            return luaL_error(L, "bad argument #1 to 'session' (option 'context' must be >= 0, got %I)", n_ctx);
    }
    ember_lua_new_session(L, 1, n_ctx, "session");
    return 1;
}

/* model:sha256_start(): starts the file's digest unless it has started (idempotent). The run
 * library calls it as soon as it knows a manifest will be written. */
static int m_sha256_start(lua_State *L) {
    ember_lua_model *lm = ember_lua_check_model(L, 1);
    if (!lm->digest) {
        lua_getiuservalue(L, 1, UV_INFO); /* [self, info] */
        lua_getfield(L, -1, "path");      /* [self, info, path] */
        ember_error err = {0};
        if (ember_digest_start(lua_tostring(L, -1), NULL, lm->verify_model, &lm->digest, &err) != EMBER_OK) {
            lua_pushnil(L);
            lua_pushstring(L, err.msg);
            return 2;
        }
    }
    lua_pushboolean(L, 1);
    return 1;
}

/* model:sha256() -> hex, "cached"|"fresh"; or nil, message when the file cannot be hashed.
 * Waits for the background digest, finishing it on this thread. */
static int m_sha256(lua_State *L) {
    ember_lua_model *lm = ember_lua_check_model(L, 1);
    if (!lm->digest) {
        int n = m_sha256_start(L);
        if (n == 2) return 2;
        lua_settop(L, 1);
    }
    char hex[65];
    ember_digest_source src;
    ember_error err = {0};
    if (ember_digest_wait(lm->digest, hex, &src, &err) != EMBER_OK) {
        lua_pushnil(L);
        lua_pushstring(L, err.msg);
        return 2;
    }
    lua_pushstring(L, hex);
    lua_pushstring(L, ember_digest_source_name(src));
    return 2;
}

/* close, __gc and __close: idempotent; the engine model goes when its last session does. */
static int m_close(lua_State *L) {
    ember_lua_model *lm = luaL_checkudata(L, 1, EMBER_LUA_MODEL);
    ember_digest_free(lm->digest); /* stops an unfinished hash: nobody can ask for it any more */
    lm->digest = NULL;
    lm->closed = true;
    free_if_unused(lm);
    return 0;
}

static int m_tostring(lua_State *L) {
    ember_lua_model *lm = luaL_checkudata(L, 1, EMBER_LUA_MODEL);
    if (lm->closed) {
        lua_pushliteral(L, "ember.Model (closed)");
        return 1;
    }
    const ember_model_info *in = ember_model_get_info(lm->m);
    lua_pushfstring(L, "ember.Model(%s%s%s%s: %I layers, hidden %I, vocab %I, %s, kernels=%s%s)", in->family,
                    in->name ? " '" : "", in->name ? in->name : "", in->name ? "'" : "", (lua_Integer)in->n_layers,
                    (lua_Integer)in->hidden_size, (lua_Integer)in->n_vocab, in->dtype_summary, in->kernels,
                    in->experimental ? ", experimental" : "");
    return 1;
}

/* core.FAMILIES: the engine's family table in its order, each row { name =, architectures = { ... },
 * experimental = }, and each row also under its name (FAMILIES.llama). */
static void push_families(lua_State *L) {
    const int n = ember_family_count();
    lua_createtable(L, n, n); /* [families] */
    for (int i = 0; i < n; i++) {
        const ember_family_info *f = ember_family_get(i);
        lua_createtable(L, 0, 3); /* [families, row] */
        lua_pushstring(L, f->name);
        lua_setfield(L, -2, "name");
        lua_newtable(L); /* [families, row, architectures] */
        for (int a = 0; f->architectures[a]; a++) {
            lua_pushstring(L, f->architectures[a]);
            lua_rawseti(L, -2, a + 1);
        }
        lua_setfield(L, -2, "architectures");
        lua_pushboolean(L, f->experimental);
        lua_setfield(L, -2, "experimental");
        lua_pushvalue(L, -1);
        lua_setfield(L, -3, f->name);
        lua_rawseti(L, -2, i + 1); /* [families] */
    }
}

void ember_lua_open_model(lua_State *L, int module) {
    static const luaL_Reg methods[] = {{"session", m_session},
                                       {"tokenize", m_tokenize},
                                       {"detokenize", m_detokenize},
                                       {"set_tokenizer", m_set_tokenizer},
                                       {"close", m_close},
                                       {"sha256", m_sha256},
                                       {"sha256_start", m_sha256_start},
                                       {NULL, NULL}};
    static const luaL_Reg meta[] = {{"__gc", m_close}, {"__close", m_close}, {"__tostring", m_tostring}, {NULL, NULL}};
    static const luaL_Reg getters[] = {
        {"info", m_get_info}, {"tokenizer", m_get_tokenizer}, {"closed", m_get_closed}, {NULL, NULL}};
    ember_lua_new_class(L, EMBER_LUA_MODEL, methods, meta, getters);
    lua_pop(L, 1);
    lua_pushcfunction(L, l_load);
    lua_setfield(L, module, "load");
    push_families(L);
    lua_setfield(L, module, "FAMILIES");
    static const luaL_Reg internal[] = {{"need_tokenizer", l_need_tokenizer}, {NULL, NULL}};
    ember_lua_set_internal(L, module, internal);
}
