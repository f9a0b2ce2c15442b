/* fuzz_lua.c — one libFuzzer harness per Lua driver: fuzz/drivers/NAME.lua (NAME given at build
 * time as EMBER_FUZZ_DRIVER) returns a function that takes the input's bytes and exercises a part
 * of lib/ember with them. A Lua error the driver catches is the expected answer to bad bytes; an
 * error that escapes the driver (it re-raises what it considers a bug), a crash or a sanitizer
 * report is a finding. One Lua state serves every input.
 *
 * The Lua code is not compiled, so the sanitizer coverage of C alone cannot guide the fuzzer
 * through it: a line hook feeds Lua-level coverage (edges between source lines) into a counter
 * array registered with libFuzzer as an extra module of inline 8-bit counters. */
#include "fuzz_lua_state.h"

#include <lauxlib.h>
#include <lua.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#if !defined(EMBER_SOURCE_DIR) || !defined(EMBER_FUZZ_DRIVER)
#error "EMBER_SOURCE_DIR (the source tree) and EMBER_FUZZ_DRIVER (a fuzz/drivers/ name) must be defined"
#endif

/* ---- Lua line coverage as libFuzzer counters ---------------------------------------------------- */

void __sanitizer_cov_8bit_counters_init(uint8_t *start, uint8_t *stop);
void __sanitizer_cov_pcs_init(const uintptr_t *pcs_beg, const uintptr_t *pcs_end);

#define LUA_COV_SLOTS (1u << 16)
static uint8_t lua_cov[LUA_COV_SLOTS];
static uintptr_t lua_cov_pcs[2 * LUA_COV_SLOTS]; /* libFuzzer wants a (pc, flags) pair per counter */
static uintptr_t lua_cov_prev;

__attribute__((constructor)) static void lua_cov_register(void) {
    for (uintptr_t i = 0; i < LUA_COV_SLOTS; i++) lua_cov_pcs[2 * i] = (uintptr_t)&lua_cov[i]; /* unique */
    __sanitizer_cov_8bit_counters_init(lua_cov, lua_cov + LUA_COV_SLOTS);
    __sanitizer_cov_pcs_init(lua_cov_pcs, lua_cov_pcs + 2 * LUA_COV_SLOTS);
}

static void lua_cov_hook(lua_State *L, lua_Debug *ar) {
    if (!lua_getinfo(L, "S", ar)) return;
    /* a function's source string lives as long as its prototype: its address names the chunk */
    uintptr_t here = ((uintptr_t)ar->source >> 4) * 2654435761u + (uintptr_t)ar->currentline;
    lua_cov[(here ^ lua_cov_prev) % LUA_COV_SLOTS]++;
    lua_cov_prev = here >> 1;
}

static lua_State *state(void) {
    static lua_State *L;
    if (L) return L;
    L = ember_fuzz_lua_new();
    const char *file = EMBER_SOURCE_DIR "/fuzz/drivers/" EMBER_FUZZ_DRIVER ".lua";
    if (luaL_loadfile(L, file) != LUA_OK || lua_pcall(L, 0, 1, 0) != LUA_OK || !lua_isfunction(L, -1)) {
        fprintf(stderr, "fuzz driver %s: %s\n", file,
                lua_isstring(L, -1) ? lua_tostring(L, -1) : "did not return a function");
        abort();
    }
    lua_setfield(L, LUA_REGISTRYINDEX, "ember.fuzz.driver");
    lua_sethook(L, lua_cov_hook, LUA_MASKLINE, 0);
    return L;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    lua_State *L = state();
    lua_cov_prev = 0;
    lua_getfield(L, LUA_REGISTRYINDEX, "ember.fuzz.driver");
    lua_pushlstring(L, (const char *)data, size);
    if (lua_pcall(L, 1, 0, 0) != LUA_OK) {
        fprintf(stderr, "fuzz driver " EMBER_FUZZ_DRIVER ": %s\n", lua_isstring(L, -1) ? lua_tostring(L, -1) : "?");
        abort();
    }
    lua_gc(L, LUA_GCCOLLECT, 0); /* what the input made is freed now, so leaks are seen per input */
    return 0;
}
