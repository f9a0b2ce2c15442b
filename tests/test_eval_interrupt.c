/* test_eval_interrupt.c — Ctrl-C during an evaluation that runs no Lua hook reaches the Lua thread
 * that asked for it, for each of s:prefill, s:decode and core.internal.evaluate (the evaluation
 * frame publishes that thread in ember_lua_running). The "Ctrl-C" is pressed from inside the
 * engine: this executable defines malloc and realloc, and the first allocation the engine makes
 * once armed (a fresh session's workspace, grown at its first evaluation) does what ember-lua's
 * SIGINT handler does. A coroutine then must stop with "interrupted" right after the call returns.
 * AddressSanitizer replaces malloc itself, so under it the test is skipped (exit 77). */
#include "ember.h"
#include "lbind.h"
#include "test_support.h"
#include "ember_tiny_model.h"

#include <lualib.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#define EMBER_ALLOC_HOOK 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMBER_ALLOC_HOOK 0
#endif
#endif
#ifndef EMBER_ALLOC_HOOK
#define EMBER_ALLOC_HOOK 1
#endif

static lua_State *main_L;
static pthread_t main_thread;
static volatile int armed;       /* the next engine allocation on the main thread presses Ctrl-C */
static lua_State *volatile seen; /* ember_lua_running when it did */
static volatile int pressed;

/* What ember-lua's lstop does: the hooks and the flag go, then "interrupted" is raised. */
static void lstop(lua_State *L, lua_Debug *ar) {
    (void)ar;
    ember_lua_interrupted = 0;
    lua_sethook(L, NULL, 0, 0);
    lua_sethook(main_L, NULL, 0, 0);
    lua_pushliteral(L, "interrupted");
    lua_error(L);
}

/* What ember-lua's on_sigint does, from inside the engine. */
static void press_ctrl_c(void) {
    armed = 0;
    pressed = 1;
    seen = ember_lua_running;
    ember_lua_interrupted = 1;
    const int mask = LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT;
    lua_sethook(main_L, lstop, mask, 1);
    if (seen && seen != main_L) lua_sethook(seen, lstop, mask, 1);
}

#if EMBER_ALLOC_HOOK
void *__libc_malloc(size_t n);
void *__libc_realloc(void *p, size_t n);
void *malloc(size_t n);
void *realloc(void *p, size_t n);

static void maybe_press(void) {
    if (armed && pthread_equal(pthread_self(), main_thread)) press_ctrl_c();
}
void *malloc(size_t n) {
    maybe_press();
    return __libc_malloc(n);
}
void *realloc(void *p, size_t n) {
    maybe_press();
    return __libc_realloc(p, n);
}
#endif

/* Lua's own blocks bypass the hook (they are not the engine's). */
static void *lua_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
    (void)ud, (void)osize;
    if (nsize == 0) {
        free(ptr);
        return NULL;
    }
#if EMBER_ALLOC_HOOK
    return __libc_realloc(ptr, nsize);
#else
    return realloc(ptr, nsize);
#endif
}

/* arm(): the engine's next allocation presses Ctrl-C. pressed() -> whether it did, and whether
 * ember_lua_running then named the calling coroutine (arg 1). */
static int l_arm(lua_State *L) {
    (void)L;
    pressed = 0;
    seen = NULL;
    armed = 1;
    return 0;
}

static int l_pressed(lua_State *L) {
    lua_pushboolean(L, pressed);
    lua_pushboolean(L, seen != NULL && seen == lua_tothread(L, 1));
    return 2;
}

static const char *const script =
    "local core, path = require('ember.core'), ...\n"
    "local m = core.load{ model = path, kernels = 'reference', threads = 1 }\n"
    "local calls = {\n"
    "  prefill = function(s) s:prefill({ 1, 2, 3 }) end,\n"
    "  decode = function(s) s:decode(5) end,\n"
    "  evaluate_prefill = function(s) core.internal.evaluate(s, { 1, 2, 3 }, nil, nil, 'evaluate') end,\n"
    "  evaluate_decode = function(s) core.internal.evaluate(s, 5, nil, nil, 'evaluate') end,\n"
    "}\n"
    "local out = {}\n"
    "for _, name in ipairs({ 'prefill', 'decode', 'evaluate_prefill', 'evaluate_decode' }) do\n"
    "  local reached = false\n"
    "  local co\n"
    "  co = coroutine.create(function()\n"
    "    local s = m:session{ context = 16 }\n"
    "    arm()\n"
    "    calls[name](s)\n"
    "    reached = true\n"
    "  end)\n"
    "  local ok, err = coroutine.resume(co)\n"
    "  local was_pressed, in_co = pressed(co)\n"
    "  out[#out + 1] = string.format('%s %s %s %s %s %s', name, tostring(was_pressed), tostring(in_co),\n"
    "    tostring(ok), tostring(err), tostring(reached))\n"
    "end\n"
    "return table.concat(out, '\\n')\n";

int main(void) {
    if (!EMBER_ALLOC_HOOK)
        return ember_test_skip("AddressSanitizer owns malloc: the engine's allocations cannot be hooked");
    char path[1200];
    snprintf(path, sizeof path, "%s/eval-interrupt-llama.gguf", ember_test_tmpdir());
    ember_tiny_model_params p;
    ember_tiny_model_defaults(&p);
    p.n_layer = 2;
    ember_error err = {0};
    if (ember_tiny_model_write(&p, path, &err) != EMBER_OK) {
        CHECK_MSG(false, "write: %.900s", err.msg);
        return ember_test_finish();
    }
    main_thread = pthread_self();
    lua_State *L = lua_newstate(lua_alloc, NULL);
    main_L = L;
    luaL_openlibs(L);
    luaL_requiref(L, "ember.core", luaopen_ember_core, 0);
    lua_pop(L, 1);
    lua_register(L, "arm", l_arm);
    lua_register(L, "pressed", l_pressed);
    if (luaL_loadstring(L, script) != LUA_OK) {
        CHECK_MSG(false, "%s", lua_tostring(L, -1));
        lua_close(L);
        return ember_test_finish();
    }
    lua_pushstring(L, path);
    if (lua_pcall(L, 1, 1, 0) != LUA_OK) {
        CHECK_MSG(false, "the script stopped: %s", lua_tostring(L, -1));
    } else {
        const char *got = lua_tostring(L, -1);
        /* each call: the engine pressed Ctrl-C with the coroutine published, and the coroutine
         * stopped with "interrupted" as soon as the call returned (the next line never ran) */
        const char *want = "prefill true true false interrupted false\n"
                           "decode true true false interrupted false\n"
                           "evaluate_prefill true true false interrupted false\n"
                           "evaluate_decode true true false interrupted false";
        CHECK_MSG(got && strcmp(got, want) == 0, "got:\n%s\nwant:\n%s", got ? got : "(nil)", want);
    }
    lua_close(L);
    return ember_test_finish();
}
