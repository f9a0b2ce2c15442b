/* test_hook_alloc.c — hook calls allocate nothing: a lua_State whose lua_Alloc counts every
 * allocation loads the ember core and attaches an experiment with a Lua method on every tensor
 * stage every family has (methods that only read: the view, the context, ctx:token_position()). Then 100 decode
 * steps run twice — driven from C (engine session + the runner's hook table) and from Lua (the
 * evaluate/sampler primitives generate.lua is built on) — and the allocation count of steps
 * 51..100 must not grow at all. The count is Lua's own (every block the VM asks for); the engine's
 * mallocs are covered by test_alloc. */
#include "ember.h"
#include "l_experiment.h"
#include "l_model.h"
#include "test_support.h"
#include "ember_tiny_model.h"

#include <lualib.h>
#include <stdlib.h>
#include <string.h>

enum { PROMPT = 4, STEPS = 100, WARMUP = 50 };

static unsigned long long lua_allocs; /* blocks the VM asked for (new or grown) */

static void *counting_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
    (void)ud;
    if (nsize == 0) {
        free(ptr);
        return NULL;
    }
    if (!ptr || nsize > osize) lua_allocs++;
    return realloc(ptr, nsize);
}

/* alloc_count() -> the counter, for the Lua-driven loop (an integer: pushing it allocates nothing). */
static int l_alloc_count(lua_State *L) {
    lua_pushinteger(L, (lua_Integer)lua_allocs);
    return 1;
}

/* Every tensor stage reads its view and its context; `calls` counts the calls. */
static const char *const experiment_src = "local core, path = ...\n"
                                          "model = core.load{ model = path, kernels = 'reference', threads = 1 }\n"
                                          "calls, sum = 0, 0.0\n"
                                          "exp = { name = 'readers' }\n"
                                          "for _, st in ipairs(core.stages) do\n"
                                          "  if not core.STAGES[st].families then\n"
                                          "  exp[st] = function(self, ctx, v)\n"
                                          "    calls = calls + 1\n"
                                          "    local tp = ctx:token_position()\n"
                                          "    local l, p, n = ctx.layer_index, ctx.phase, ctx.sequence_length\n"
                                          "    sum = sum + v:get(1, 1) + #v + n + (tp or 0) + (l or 0)\n"
                                          "    if p ~= 'decode' and p ~= 'prefill' then error('bad phase') end\n"
                                          "  end\n"
                                          "  end\n"
                                          "end\n";

/* The same steps through the Lua primitives: evaluate (with the runner and a sampler) per token. */
static const char *const lua_loop_src =
    "local core = ...\n"
    "local I = core.internal\n"
    "local s = I.session(model, 256, 'test')\n"
    "local smp = core.sampler{ n_vocab = model.info.n_vocab, temperature = 0.8, top_k = 40, top_p = 0.9, seed = 7 }\n"
    "local r = I.attach(exp, model, 'test')\n"
    "local evaluate, count = I.evaluate, alloc_count\n"
    "local id = evaluate(s, { 1, 2, 3, 4 }, r, smp, 'test')\n"
    "local c0, mark = calls, 0\n"
    "for k = 1, 100 do\n"
    "  if k == 51 then mark = count() end\n"
    "  id = evaluate(s, id, r, smp, 'test')\n"
    "end\n"
    "local grown = count() - mark\n"
    "s:close()\n"
    "return grown, calls - c0\n";

static bool run_chunk(lua_State *L, const char *src, const char *name, int nargs, int nres) {
    if (luaL_loadbuffer(L, src, strlen(src), name) != LUA_OK) {
        CHECK_MSG(false, "%s: %s", name, lua_tostring(L, -1));
        return false;
    }
    lua_insert(L, -nargs - 1);
    if (lua_pcall(L, nargs, nres, 0) != LUA_OK) {
        CHECK_MSG(false, "%s: %s", name, lua_tostring(L, -1));
        return false;
    }
    return true;
}

int main(void) {
    char path[1200];
    snprintf(path, sizeof path, "%s/hook-alloc-llama.gguf", ember_test_tmpdir());
    ember_tiny_model_params p;
    ember_tiny_model_defaults(&p);
    ember_error err = {0};
    if (ember_tiny_model_write(&p, path, &err) != EMBER_OK) {
        CHECK_MSG(false, "write %.200s: %.700s", path, err.msg);
        return ember_test_finish();
    }

    lua_State *L = lua_newstate(counting_alloc, NULL);
    luaL_openlibs(L);
    luaL_requiref(L, "ember.core", luaopen_ember_core, 0); /* [core] */
    int core = lua_gettop(L);
    lua_register(L, "alloc_count", l_alloc_count);

    /* The counter works: a new table is one allocation at least. */
    unsigned long long before = lua_allocs;
    lua_newtable(L);
    lua_pop(L, 1);
    CHECK(lua_allocs > before);

    lua_pushvalue(L, core);
    lua_pushstring(L, path);
    if (!run_chunk(L, experiment_src, "=experiment", 2, 0)) goto done;
    lua_getglobal(L, "model"); /* [core, model] */
    lua_getglobal(L, "exp");   /* [core, model, exp] */
    int model_idx = core + 1, exp_idx = core + 2;
    const int64_t n_layers = p.n_layer, per_step = 7 * n_layers + 2; /* tensor hook calls per evaluation */

    /* ---- driven from C: the engine's decode with the runner's hook table ---- */
    ember_lua_runner *r = ember_lua_runner_attach(L, exp_idx, model_idx, "test"); /* [.., runner] */
    const ember_hooks *hooks = ember_lua_runner_hooks(L, r);
    ember_lua_model *lm = ember_lua_check_model(L, model_idx);
    ember_session *s = NULL;
    CHECK(hooks != NULL);
    if (!hooks || ember_session_new(lm->m, 256, &s, &err) != EMBER_OK) {
        CHECK_MSG(false, "session: %.900s", err.msg);
        goto done;
    }
    const int64_t n_vocab = ember_model_get_info(lm->m)->n_vocab;
    int32_t ids[PROMPT] = {1, 2, 3, 4};
    bool ok = ember_session_prefill(s, ids, PROMPT, hooks, &err) == EMBER_OK;
    unsigned long long mark = 0;
    lua_Integer calls0 = 0;
    for (int k = 1; ok && k <= STEPS; k++) {
        if (k == WARMUP + 1) {
            mark = lua_allocs;
            lua_getglobal(L, "calls");
            calls0 = lua_tointeger(L, -1);
            lua_pop(L, 1);
        }
        int32_t id = (int32_t)ember_argmax(ember_session_logits(s), n_vocab);
        ok = ember_session_decode(s, id, hooks, &err) == EMBER_OK;
    }
    unsigned long long grown = lua_allocs - mark;
    CHECK_MSG(ok, "decode: %.900s", err.msg);
    lua_getglobal(L, "calls");
    lua_Integer calls = lua_tointeger(L, -1) - calls0;
    lua_pop(L, 1);
    ember_session_free(s);
    CHECK_MSG(calls == (STEPS - WARMUP) * per_step, "C-driven: %lld hook calls in steps 51..100, expected %lld",
              (long long)calls, (long long)((STEPS - WARMUP) * per_step));
    CHECK_MSG(grown == 0, "C-driven: %llu Lua allocations in decode steps 51..100 with a hook on every stage", grown);

    /* ---- driven from Lua: the primitives of generate ---- */
    lua_pushvalue(L, core);
    if (!run_chunk(L, lua_loop_src, "=lua-loop", 1, 2)) goto done;
    lua_Integer lua_grown = lua_tointeger(L, -2), lua_calls = lua_tointeger(L, -1);
    CHECK_MSG(lua_calls == STEPS * per_step, "Lua-driven: %lld hook calls in 100 steps, expected %lld",
              (long long)lua_calls, (long long)(STEPS * per_step));
    CHECK_MSG(lua_grown == 0, "Lua-driven: %lld Lua allocations in decode steps 51..100 with a hook on every stage",
              (long long)lua_grown);
done:
    lua_close(L);
    return ember_test_finish();
}
