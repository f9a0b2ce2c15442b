/* l_sae.c — ember.SAE: an engine SAE (src/engine/sae.c) built from a spec the Lua readers fill,
 * and its encode, decode and decoder directions on owned Tensors. Must not read files or know a
 * file format: lib/ember/sae/ turns SAELens, Gemma Scope and Llama Scope files into the spec. */
#include "l_sae.h"

#include <math.h>
#include <string.h>

#include "l_model.h"
#include "l_tensor.h"

#define SAE_CLOSED_MSG "attempt to use a closed SAE"

typedef struct {
    ember_sae *sae;      /* NULL once freed */
    bool closed;         /* what Lua sees; the engine SAE stays while sites splice it in */
    int64_t n_sites;     /* ember.SAESites holding it */
    ember_lua_model *lm; /* the model whose compute it runs on, or NULL */
    int64_t d_in, d_sae, d_out;
} ember_lua_sae;

static void sae_free_if_unused(ember_lua_sae *ls) {
    if (!ls->sae || !ls->closed || ls->n_sites > 0) return;
    ember_sae_free(ls->sae);
    ls->sae = NULL;
    if (ls->lm) ember_lua_model_release(ls->lm);
    ls->lm = NULL;
}

ember_sae *ember_lua_check_sae(lua_State *L, int i) {
    ember_lua_sae *ls = luaL_checkudata(L, i, EMBER_LUA_SAE);
    if (ls->closed) luaL_error(L, SAE_CLOSED_MSG);
    if (ls->lm && ls->lm->closed) luaL_error(L, "attempt to use an SAE of a closed model");
    return ls->sae;
}

/* ---- the spec ---------------------------------------------------------------------------------- */

static int64_t spec_int(lua_State *L, int t, const char *k, int64_t def) {
    return (int64_t)ember_lua_opt_int_field(L, t, "sae_new", k, (lua_Integer)def);
}

static bool spec_bool(lua_State *L, int t, const char *k) {
    lua_getfield(L, t, k);
    bool v = lua_toboolean(L, -1);
    lua_pop(L, 1);
    return v;
}

/* The index of spec[k] in names (NULL-terminated); raises naming the field for anything else. */
static int spec_enum(lua_State *L, int t, const char *k, const char *const *names) {
    const char *s = ember_lua_opt_str_field(L, t, "sae_new", k, names[0]);
    for (int i = 0; names[i]; i++)
        if (strcmp(s, names[i]) == 0) return i;
    return luaL_error(L, "sae_new: %s '%s' is not one of the known values (did you mean '%s'?)", k, s,
                      ember_lua_closest(s, names));
}

static ember_type dtype_of(lua_State *L, const char *s, const char *what) {
    if (strcmp(s, "F32") == 0 || strcmp(s, "f32") == 0) return EMBER_TYPE_F32;
    if (strcmp(s, "F16") == 0 || strcmp(s, "f16") == 0) return EMBER_TYPE_F16;
    if (strcmp(s, "BF16") == 0 || strcmp(s, "bf16") == 0) return EMBER_TYPE_BF16;
    luaL_error(L, "sae_new: %s has dtype '%s' (F32, F16 or BF16 are read)", what, s);
    return EMBER_TYPE_F32;
}

/* spec.tensors[name] = { data = string, offset = byte offset (0-based), dtype = "F32", shape = {..} }
 * into t (absent: t->data NULL). The strings stay referenced by the spec for the whole call. */
static void spec_tensor(lua_State *L, int tensors, const char *name, ember_sae_tensor *t) {
    memset(t, 0, sizeof *t);
    if (lua_getfield(L, tensors, name) != LUA_TTABLE) { /* [.., e] */
        lua_pop(L, 1);
        return;
    }
    int e = lua_gettop(L);
    lua_getfield(L, e, "data");
    size_t len;
    const char *data = lua_tolstring(L, -1, &len);
    if (!data) luaL_error(L, "sae_new: tensor '%s' has no data string", name);
    int64_t off = (int64_t)ember_lua_opt_int_field(L, e, "sae_new", "offset", 0);
    t->type = dtype_of(L, ember_lua_opt_str_field(L, e, "sae_new", "dtype", "F32"), name);
    lua_getfield(L, e, "shape");
    int64_t dims[2] = {1, 1}, n = (int64_t)lua_rawlen(L, -1);
    if (!lua_istable(L, -1) || n < 1 || n > 2) luaL_error(L, "sae_new: tensor '%s' needs a shape of 1 or 2 dims", name);
    for (int64_t i = 0; i < n; i++) {
        lua_rawgeti(L, -1, i + 1);
        dims[i + 2 - n] = (int64_t)lua_tointeger(L, -1);
        if (dims[i + 2 - n] < 1) luaL_error(L, "sae_new: tensor '%s' has an empty dimension", name);
        lua_pop(L, 1);
    }
    const size_t esize = t->type == EMBER_TYPE_F32 ? 4 : 2;
    if (off < 0 || (uint64_t)dims[0] > SIZE_MAX / esize / (uint64_t)dims[1] || (size_t)off > len ||
        (size_t)(dims[0] * dims[1]) * esize > len - (size_t)off)
        luaL_error(L, "sae_new: tensor '%s' [%I, %I] does not fit its %I bytes at offset %I", name,
                   (lua_Integer)dims[0], (lua_Integer)dims[1], (lua_Integer)len, (lua_Integer)off);
    t->data = data + off;
    t->rows = dims[0];
    t->cols = dims[1];
    lua_settop(L, e - 1);
}

static void read_spec(lua_State *L, int t, ember_sae_params *p) {
    static const char *const archs[] = {"standard", "jumprelu", "topk", "gated", NULL};
    static const char *const norms[] = {"none", "scale", "constant_norm_rescale", "layer_norm", NULL};
    static const char *const dtypes[] = {"f32", "f16", "bf16", NULL};
    static const ember_type dtype_ids[] = {EMBER_TYPE_F32, EMBER_TYPE_F16, EMBER_TYPE_BF16};
    memset(p, 0, sizeof *p);
    p->d_in = spec_int(L, t, "d_in", 0);
    p->d_sae = spec_int(L, t, "d_sae", 0);
    p->d_out = spec_int(L, t, "d_out", p->d_in);
    p->dtype = dtype_ids[spec_enum(L, t, "dtype", dtypes)];
    p->arch = (ember_sae_arch)spec_enum(L, t, "architecture", archs);
    p->k = spec_int(L, t, "k", 0);
    p->apply_b_dec_to_input = spec_bool(L, t, "apply_b_dec_to_input");
    p->denormalize_output = spec_bool(L, t, "denormalize_output");
    p->norm = (ember_sae_norm)spec_enum(L, t, "normalize", norms);
    p->scale_in = ember_lua_opt_num_field(L, t, "sae_new", "scale_in", 1.0);
    p->scale_out = ember_lua_opt_num_field(L, t, "sae_new", "scale_out", 1.0);
    p->threshold_all = ember_lua_opt_num_field(L, t, "sae_new", "threshold_all", 0.0);
    p->enc_by_feature = spec_bool(L, t, "enc_by_feature");
    p->dec_by_output = spec_bool(L, t, "dec_by_output");
    p->n_threads = (int)spec_int(L, t, "threads", 0);
    const char *k = ember_lua_opt_str_field(L, t, "sae_new", "kernels", "auto");
    if (!ember_kernels_parse(k, &p->kernels)) luaL_error(L, "sae_new: unknown kernels '%s'", k);
    if (lua_getfield(L, t, "tensors") != LUA_TTABLE) luaL_error(L, "sae_new: spec.tensors must be a table");
    int tensors = lua_gettop(L);
    spec_tensor(L, tensors, "W_enc", &p->w_enc);
    spec_tensor(L, tensors, "W_dec", &p->w_dec);
    spec_tensor(L, tensors, "b_enc", &p->b_enc);
    spec_tensor(L, tensors, "b_dec", &p->b_dec);
    spec_tensor(L, tensors, "threshold", &p->threshold);
    spec_tensor(L, tensors, "b_gate", &p->b_gate);
    spec_tensor(L, tensors, "b_mag", &p->b_mag);
    spec_tensor(L, tensors, "r_mag", &p->r_mag);
    spec_tensor(L, tensors, "scaling_factor", &p->scaling);
    lua_pop(L, 1);
}

/* core.sae_new(spec [, model]) -> ember.SAE (the spec's fields: see lib/ember/sae/init.lua) */
static int l_sae_new(lua_State *L) {
    luaL_checktype(L, 1, LUA_TTABLE);
    ember_lua_model *lm = lua_isnoneornil(L, 2) ? NULL : ember_lua_check_model(L, 2);
    ember_sae_params p;
    read_spec(L, 1, &p);
    /* user value 1: the model, kept alive while the SAE runs on its compute */
    ember_lua_sae *ls = lua_newuserdatauv(L, sizeof *ls, 1); /* [spec, model?, sae] */
    memset(ls, 0, sizeof *ls);
    luaL_setmetatable(L, EMBER_LUA_SAE);
    ember_error err = {0};
    if (ember_sae_new(lm ? lm->m : NULL, &p, &ls->sae, &err) != EMBER_OK) return luaL_error(L, "%s", err.msg);
    if (lm) {
        lua_pushvalue(L, 2);
        lua_setiuservalue(L, -2, 1);
        ls->lm = lm;
        lm->n_sessions++; /* released when the engine SAE is freed */
    }
    ls->d_in = p.d_in;
    ls->d_sae = p.d_sae;
    ls->d_out = p.d_out;
    return 1;
}

/* ---- methods ----------------------------------------------------------------------------------- */

/* The largest result a method makes (as ember.tensor()): 2^32 values. */
#define MAX_ELEMENTS ((int64_t)1 << 32)

static ember_lua_sae *check_open(lua_State *L) {
    ember_lua_check_sae(L, 1);
    return lua_touserdata(L, 1);
}

static const float *check_width(lua_State *L, int i, int64_t want, const char *fname, const char *what, int64_t *rows) {
    int64_t cols;
    const float *x = ember_lua_check_values(L, i, rows, &cols, fname);
    if (cols != want)
        luaL_error(L, "%s: expected [rows, %I] %s, got [%I, %I]", fname, (lua_Integer)want, what, (lua_Integer)*rows,
                   (lua_Integer)cols);
    return x;
}

/* sae:encode(t) -> Tensor [rows, d_sae] */
static int s_encode(lua_State *L) {
    ember_lua_sae *ls = check_open(L);
    int64_t rows;
    const float *x = check_width(L, 2, ls->d_in, "encode", "activations (d_in)", &rows);
    if (rows > MAX_ELEMENTS / ls->d_sae)
        return luaL_error(L, "encode: %I rows exceed 2^32 features", (lua_Integer)rows);
    ember_lua_tensor *f = ember_lua_push_tensor(L, rows, ls->d_sae);
    ember_error err = {0};
    if (ember_sae_encode(ls->sae, x, rows, f->data, &err) != EMBER_OK) return luaL_error(L, "encode: %s", err.msg);
    return 1;
}

/* sae:decode(f [, x]) -> Tensor [rows, d_out]; x: the inputs f came from (row-dependent norms) */
static int s_decode(lua_State *L) {
    ember_lua_sae *ls = check_open(L);
    int64_t rows, xrows = 0;
    const float *f = check_width(L, 2, ls->d_sae, "decode", "features (d_sae)", &rows);
    const float *x = lua_isnoneornil(L, 3) ? NULL : check_width(L, 3, ls->d_in, "decode", "inputs (d_in)", &xrows);
    if (x && xrows != rows)
        return luaL_error(L, "decode: %I feature rows but %I input rows", (lua_Integer)rows, (lua_Integer)xrows);
    if (rows > MAX_ELEMENTS / ls->d_out) return luaL_error(L, "decode: %I rows exceed 2^32 values", (lua_Integer)rows);
    ember_lua_tensor *out = ember_lua_push_tensor(L, rows, ls->d_out);
    ember_error err = {0};
    if (ember_sae_decode(ls->sae, f, x, rows, out->data, &err) != EMBER_OK) return luaL_error(L, "decode: %s", err.msg);
    return 1;
}

/* sae:direction(feature) -> Tensor [1, d_out]: feature (0-based) 's decoder row */
static int s_direction(lua_State *L) {
    ember_lua_sae *ls = check_open(L);
    lua_Integer i = luaL_checkinteger(L, 2);
    ember_lua_tensor *out = ember_lua_push_tensor(L, 1, ls->d_out);
    ember_error err = {0};
    if (ember_sae_direction(ls->sae, (int64_t)i, out->data, &err) != EMBER_OK)
        return luaL_error(L, "direction: %s", err.msg);
    return 1;
}

static int s_close(lua_State *L) {
    ember_lua_sae *ls = luaL_checkudata(L, 1, EMBER_LUA_SAE);
    ls->closed = true;
    sae_free_if_unused(ls);
    return 0;
}

static int s_kernels(lua_State *L) {
    lua_pushstring(L, ember_sae_kernels(ember_lua_check_sae(L, 1)));
    return 1;
}

static int s_tostring(lua_State *L) {
    ember_lua_sae *ls = luaL_checkudata(L, 1, EMBER_LUA_SAE);
    if (ls->closed) lua_pushstring(L, "ember.SAE (closed)");
    else
        lua_pushfstring(L, "ember.SAE(d_in=%I, d_sae=%I, d_out=%I)", (lua_Integer)ls->d_in, (lua_Integer)ls->d_sae,
                        (lua_Integer)ls->d_out);
    return 1;
}

/* ---- sites: SAEs spliced into forward passes ------------------------------------------------------ */

#define EMBER_LUA_SAE_SITES "ember.SAESites"

typedef struct {
    ember_sae_sites *sites; /* NULL once freed */
} ember_lua_sae_sites;

ember_sae_sites *ember_lua_check_sae_sites(lua_State *L, int i) {
    ember_lua_sae_sites *u = luaL_checkudata(L, i, EMBER_LUA_SAE_SITES);
    if (!u->sites) luaL_error(L, "attempt to use freed SAE sites");
    return u->sites;
}

static ember_stage stage_named(lua_State *L, int t, const char *k) {
    const char *name = ember_lua_opt_str_field(L, t, "sae_sites", k, "");
    for (int s = 0; s < EMBER_STAGE_COUNT; s++)
        if (strcmp(name, ember_stage_name((ember_stage)s)) == 0) return (ember_stage)s;
    return (ember_stage)luaL_error(L, "sae_sites: %s '%s' is not a stage", k, name);
}

/* Entry t of the list: { sae = ember.SAE, stage =, layer =, col0 =, stage_out =, layer_out =,
 * col0_out =, splice = "error" | "reconstruction" } */
static void read_site(lua_State *L, int t, ember_sae_site *site) {
    static const char *const splices[] = {"error", "reconstruction", NULL};
    lua_getfield(L, t, "sae");
    site->sae = ember_lua_check_sae(L, -1);
    lua_pop(L, 1);
    site->stage = stage_named(L, t, "stage");
    site->layer = (int64_t)ember_lua_opt_int_field(L, t, "sae_sites", "layer", -1);
    site->col0 = (int64_t)ember_lua_opt_int_field(L, t, "sae_sites", "col0", 0);
    site->sliced = spec_bool(L, t, "sliced");
    site->sliced_out = spec_bool(L, t, "sliced_out");
    lua_getfield(L, t, "stage_out");
    bool same = lua_isnil(L, -1);
    lua_pop(L, 1);
    site->stage_out = same ? site->stage : stage_named(L, t, "stage_out");
    site->layer_out = (int64_t)ember_lua_opt_int_field(L, t, "sae_sites", "layer_out", site->layer);
    site->col0_out = (int64_t)ember_lua_opt_int_field(L, t, "sae_sites", "col0_out", site->col0);
    site->splice = (ember_sae_splice)spec_enum(L, t, "splice", splices);
}

/* core.sae_sites({ site, ... }) -> ember.SAESites; the SAEs are kept alive by it */
static int l_sae_sites(lua_State *L) {
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_Integer n = (lua_Integer)lua_rawlen(L, 1);
    if (n < 1 || n > 64) return luaL_error(L, "sae_sites: 1 to 64 sites, got %I", n);
    ember_sae_site *sites = lua_newuserdatauv(L, (size_t)n * sizeof *sites, 0); /* [list, buf] */
    lua_createtable(L, (int)n, 0);                                              /* [list, buf, keep] */
    for (lua_Integer i = 1; i <= n; i++) {
        if (lua_rawgeti(L, 1, i) != LUA_TTABLE) return luaL_error(L, "sae_sites: site %I is not a table", i);
        read_site(L, lua_gettop(L), &sites[i - 1]);
        lua_getfield(L, -1, "sae");
        lua_rawseti(L, -3, i); /* keep[i] = the SAE */
        lua_pop(L, 1);
    }
    ember_lua_sae_sites *u = lua_newuserdatauv(L, sizeof *u, 1); /* [list, buf, keep, u] */
    u->sites = NULL;
    luaL_setmetatable(L, EMBER_LUA_SAE_SITES);
    /* counted once u holds them: its __gc gives each back */
    for (lua_Integer i = 1; i <= n; i++) {
        lua_rawgeti(L, -2, i);
        ((ember_lua_sae *)lua_touserdata(L, -1))->n_sites++;
        lua_pop(L, 1);
    }
    lua_pushvalue(L, -2);
    lua_setiuservalue(L, -2, 1);
    ember_error err = {0};
    if (ember_sae_sites_new(sites, (int)n, &u->sites, &err) != EMBER_OK) return luaL_error(L, "%s", err.msg);
    return 1;
}

/* Frees the sites, then lets each SAE go if it was closed meanwhile. */
static int sites_gc(lua_State *L) {
    ember_lua_sae_sites *u = luaL_checkudata(L, 1, EMBER_LUA_SAE_SITES);
    ember_sae_sites_free(u->sites);
    u->sites = NULL;
    if (lua_getiuservalue(L, 1, 1) == LUA_TTABLE) {
        for (lua_Integer i = 1, n = (lua_Integer)lua_rawlen(L, -1); i <= n; i++) {
            lua_rawgeti(L, -1, i);
            ember_lua_sae *ls = lua_touserdata(L, -1);
            ls->n_sites--;
            sae_free_if_unused(ls);
            lua_pop(L, 1);
        }
        lua_pushnil(L);
        lua_setiuservalue(L, 1, 1); /* once only */
    }
    return 0;
}

/* sites:counts(i) -> calls, changed_rows of site i (1-based) */
static int sites_counts(lua_State *L) {
    ember_sae_sites *S = ember_lua_check_sae_sites(L, 1);
    lua_Integer i = luaL_checkinteger(L, 2);
    luaL_argcheck(L, i >= 1 && i <= ember_sae_sites_count(S), 2, "no such site");
    lua_pushinteger(L, (lua_Integer)ember_sae_sites_calls(S, (int)i - 1));
    lua_pushinteger(L, (lua_Integer)ember_sae_sites_changed_rows(S, (int)i - 1));
    return 2;
}

/* ---- feature statistics: sums over many rows, in double ------------------------------------------- */

#define EMBER_LUA_SAE_STATS "ember.SAEStats"

/* Per feature i of d: in slot k * d + i the sums below; a's are the features, b's a second set of
 * the same rows (another model's features of the same tokens), absent in the one-set form. */
enum { ST_COUNT_A, ST_SUM_A, ST_SQ_A, ST_MAX_A, ST_COUNT_B, ST_SUM_B, ST_SQ_B, ST_MAX_B, ST_AB, ST_FIELDS };
static const char *const stat_names[ST_FIELDS] = {"count", "sum",     "sumsq", "max",   "count_b",
                                                  "sum_b", "sumsq_b", "max_b", "sum_ab"};

typedef struct {
    int64_t d, rows;
    bool paired;
    double acc[]; /* (ST_FIELDS, d) */
} ember_lua_sae_stats;

/* core.sae_stats(d_sae) -> ember.SAEStats, every sum 0 (max -inf) */
static int l_sae_stats(lua_State *L) {
    lua_Integer d = luaL_checkinteger(L, 1);
    luaL_argcheck(L, d >= 1 && d <= ((lua_Integer)1 << 26), 1, "d_sae out of range");
    ember_lua_sae_stats *st = lua_newuserdatauv(L, sizeof *st + (size_t)(ST_FIELDS * d) * sizeof(double), 0);
    st->d = (int64_t)d;
    st->rows = 0;
    st->paired = false;
    for (int64_t i = 0; i < ST_FIELDS * st->d; i++) st->acc[i] = 0.0;
    for (int64_t i = 0; i < st->d; i++) st->acc[ST_MAX_A * st->d + i] = st->acc[ST_MAX_B * st->d + i] = -HUGE_VAL;
    luaL_setmetatable(L, EMBER_LUA_SAE_STATS);
    return 1;
}

/* st:add(f [, g]) -> { L0 of each row of f }: adds the rows of f (and of g, the same rows' features
 * under another model: then the cross sums too). A feature counts as active where it is > 0. */
static int stats_add(lua_State *L) {
    ember_lua_sae_stats *st = luaL_checkudata(L, 1, EMBER_LUA_SAE_STATS);
    int64_t rows, cols, grows = 0, gcols = 0;
    const float *f = ember_lua_check_values(L, 2, &rows, &cols, "add");
    const float *g = lua_isnoneornil(L, 3) ? NULL : ember_lua_check_values(L, 3, &grows, &gcols, "add");
    if (cols != st->d || (g && (grows != rows || gcols != cols)))
        return luaL_error(L, "add: expected [rows, %I] features (and a second set of the same shape)",
                          (lua_Integer)st->d);
    if (g) st->paired = true;
    const int64_t d = st->d;
    double *a = st->acc;
    lua_createtable(L, (int)rows, 0);
    for (int64_t r = 0; r < rows; r++) {
        int64_t l0 = 0;
        for (int64_t i = 0; i < d; i++) {
            const double x = f[r * d + i];
            l0 += x > 0;
            a[ST_COUNT_A * d + i] += x > 0;
            a[ST_SUM_A * d + i] += x;
            a[ST_SQ_A * d + i] += x * x;
            if (x > a[ST_MAX_A * d + i]) a[ST_MAX_A * d + i] = x;
            if (!g) continue;
            const double y = g[r * d + i];
            a[ST_COUNT_B * d + i] += y > 0;
            a[ST_SUM_B * d + i] += y;
            a[ST_SQ_B * d + i] += y * y;
            if (y > a[ST_MAX_B * d + i]) a[ST_MAX_B * d + i] = y;
            a[ST_AB * d + i] += x * y;
        }
        lua_pushinteger(L, (lua_Integer)l0);
        lua_rawseti(L, -2, (lua_Integer)r + 1);
    }
    st->rows += rows;
    return 1;
}

/* st:result() -> { rows, count = {...}, sum, sumsq, max [, count_b, sum_b, sumsq_b, max_b, sum_ab] }
 * (lists of d numbers, feature i at index i + 1) */
static int stats_result(lua_State *L) {
    ember_lua_sae_stats *st = luaL_checkudata(L, 1, EMBER_LUA_SAE_STATS);
    const int n = st->paired ? ST_FIELDS : ST_COUNT_B;
    lua_createtable(L, 0, n + 1);
    lua_pushinteger(L, (lua_Integer)st->rows);
    lua_setfield(L, -2, "rows");
    for (int k = 0; k < n; k++) {
        lua_createtable(L, (int)st->d, 0);
        for (int64_t i = 0; i < st->d; i++) {
            lua_pushnumber(L, st->acc[k * st->d + i]);
            lua_rawseti(L, -2, (lua_Integer)i + 1);
        }
        lua_setfield(L, -2, stat_names[k]);
    }
    return 1;
}

void ember_lua_open_sae(lua_State *L, int module) {
    static const luaL_Reg methods[] = {
        {"encode", s_encode}, {"decode", s_decode}, {"direction", s_direction}, {"close", s_close}, {NULL, NULL}};
    static const luaL_Reg meta[] = {{"__gc", s_close}, {"__close", s_close}, {"__tostring", s_tostring}, {NULL, NULL}};
    static const luaL_Reg getters[] = {{"kernels", s_kernels}, {NULL, NULL}};
    ember_lua_new_class(L, EMBER_LUA_SAE, methods, meta, getters);
    lua_pop(L, 1);
    lua_pushcfunction(L, l_sae_new);
    lua_setfield(L, module, "sae_new");
    static const luaL_Reg site_methods[] = {{"counts", sites_counts}, {NULL, NULL}};
    static const luaL_Reg site_meta[] = {{"__gc", sites_gc}, {NULL, NULL}};
    static const luaL_Reg no_getters[] = {{NULL, NULL}};
    ember_lua_new_class(L, EMBER_LUA_SAE_SITES, site_methods, site_meta, no_getters);
    lua_pop(L, 1);
    lua_pushcfunction(L, l_sae_sites);
    lua_setfield(L, module, "sae_sites");
    static const luaL_Reg stat_methods[] = {{"add", stats_add}, {"result", stats_result}, {NULL, NULL}};
    static const luaL_Reg stat_meta[] = {{NULL, NULL}};
    ember_lua_new_class(L, EMBER_LUA_SAE_STATS, stat_methods, stat_meta, no_getters);
    lua_pop(L, 1);
    lua_pushcfunction(L, l_sae_stats);
    lua_setfield(L, module, "sae_stats");
}
