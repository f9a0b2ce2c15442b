/* l_sampler.c — ember.Sampler: the engine's sampler (greedy, or temperature / top-k / top-p with
 * a seed) as a userdata, so that generation policy written in Lua draws the same ids bit for bit.
 * Holds the sampler's candidate buffer; drawing an id allocates nothing. */
#include "l_sampler.h"

#include "l_tensor.h"

#include <limits.h>

typedef struct {
    ember_sampler *s; /* NULL once closed */
    int64_t n_vocab;
} sampler_ud;

static void sampler_close(sampler_ud *u) {
    ember_sampler_free(u->s);
    u->s = NULL;
}

ember_sampler *ember_lua_check_sampler(lua_State *L, int i, int64_t *n_vocab) {
    sampler_ud *u = luaL_checkudata(L, i, EMBER_LUA_SAMPLER);
    if (!u->s) luaL_error(L, "attempt to use a closed sampler");
    if (n_vocab) *n_vocab = u->n_vocab;
    return u->s;
}

/* ember.sampler{ n_vocab =, temperature = 0, top_k = 0, top_p = 1, seed = 0 } [, fname]
 * fname names the caller in errors (generate passes its own name). Temperature 0 is greedy. */
static int l_sampler(lua_State *L) {
    static const char *const valid[] = {"n_vocab", "temperature", "top_k", "top_p", "seed", NULL};
    const char *f = luaL_optstring(L, 2, "sampler");
    luaL_checktype(L, 1, LUA_TTABLE);
    ember_lua_check_options(L, 1, f, valid);
    lua_Integer n_vocab = ember_lua_opt_int_field(L, 1, f, "n_vocab", 0);
    lua_Number temperature = ember_lua_opt_num_field(L, 1, f, "temperature", 0);
    lua_Integer top_k = ember_lua_opt_int_field(L, 1, f, "top_k", 0);
    lua_Number top_p = ember_lua_opt_num_field(L, 1, f, "top_p", 1);
    lua_Integer seed = ember_lua_opt_int_field(L, 1, f, "seed", 0);
    if (n_vocab < 1) return luaL_error(L, "bad argument to '%s' (n_vocab must be >= 1, got %I)", f, n_vocab);
    if (!(temperature >= 0))
        return luaL_error(L, "bad argument to '%s' (temperature must be >= 0, got %f)", f, temperature);
    if (top_k < 0) return luaL_error(L, "bad argument to '%s' (top_k must be >= 0, got %I)", f, top_k);
    /* the engine's top_k is an int: a larger value must not wrap (4294967301 would act as 5) */
    if (top_k > INT_MAX)
        return luaL_error(L, "bad argument to '%s' (top_k must be at most %d, got %I)", f, INT_MAX, top_k);
    if (!(top_p > 0 && top_p <= 1))
        return luaL_error(L, "bad argument to '%s' (top_p must be in (0, 1], got %f)", f, top_p);

    sampler_ud *u = lua_newuserdatauv(L, sizeof *u, 0); /* [.., sampler]: closed until made */
    u->s = NULL;
    u->n_vocab = n_vocab;
    luaL_setmetatable(L, EMBER_LUA_SAMPLER);
    ember_sampler_params p = {
        .temperature = (float)temperature, .top_k = (int)top_k, .top_p = (float)top_p, .seed = (uint64_t)seed};
    ember_error err = {0};
    if (ember_sampler_new(&p, n_vocab, &u->s, &err) != EMBER_OK) return luaL_error(L, "%s: %s", f, err.msg);
    return 1;
}

/* sampler:sample(logits) -> token id (0-based); logits is a Tensor or TensorView [1, n_vocab]. */
static int s_sample(lua_State *L) {
    int64_t n_vocab, rows, cols;
    ember_sampler *s = ember_lua_check_sampler(L, 1, &n_vocab);
    const float *x = ember_lua_check_values(L, 2, &rows, &cols, "sample");
    if (rows != 1 || cols != n_vocab)
        return luaL_error(L, "sample: logits must be [1, %I], got [%I, %I]", (lua_Integer)n_vocab, (lua_Integer)rows,
                          (lua_Integer)cols);
    lua_pushinteger(L, ember_sampler_sample(s, x));
    return 1;
}

static int s_close(lua_State *L) {
    sampler_close(luaL_checkudata(L, 1, EMBER_LUA_SAMPLER));
    return 0;
}

static int s_get_closed(lua_State *L) {
    sampler_ud *u = luaL_checkudata(L, 1, EMBER_LUA_SAMPLER);
    lua_pushboolean(L, u->s == NULL);
    return 1;
}

static int s_get_n_vocab(lua_State *L) {
    sampler_ud *u = luaL_checkudata(L, 1, EMBER_LUA_SAMPLER);
    lua_pushinteger(L, u->n_vocab);
    return 1;
}

static int s_tostring(lua_State *L) {
    sampler_ud *u = luaL_checkudata(L, 1, EMBER_LUA_SAMPLER);
    if (!u->s) lua_pushliteral(L, "ember.Sampler (closed)");
    else lua_pushfstring(L, "ember.Sampler(n_vocab %I)", (lua_Integer)u->n_vocab);
    return 1;
}

void ember_lua_open_sampler(lua_State *L, int module) {
    static const luaL_Reg methods[] = {{"sample", s_sample}, {"close", s_close}, {NULL, NULL}};
    static const luaL_Reg meta[] = {{"__gc", s_close}, {"__close", s_close}, {"__tostring", s_tostring}, {NULL, NULL}};
    static const luaL_Reg getters[] = {{"closed", s_get_closed}, {"n_vocab", s_get_n_vocab}, {NULL, NULL}};
    ember_lua_new_class(L, EMBER_LUA_SAMPLER, methods, meta, getters);
    lua_pop(L, 1);
    lua_pushcfunction(L, l_sampler);
    lua_setfield(L, module, "sampler");
}
