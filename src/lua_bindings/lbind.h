/* lbind.h — the helpers every file of the Lua module `ember.core` shares (lbind.c): classes,
 * option tables, GC boxes, the clock, the interrupt flag. Declares no userdata of any one file:
 * each binding file has its own small header (l_tensor.h, l_model.h, ...) for what others use. */
#ifndef EMBER_LBIND_H
#define EMBER_LBIND_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include <lauxlib.h>
#include <lua.h>

#include "ember.h"

#define EMBER_LUA_BOX "ember.Box"

/* Set by an embedding host's SIGINT handler (ember-lua); long C loops poll it between tokens so
 * Ctrl-C is seen even when no Lua code runs. Cleared by whoever acts on it. */
extern volatile sig_atomic_t ember_lua_interrupted;

/* The Lua thread that runs engine work right now (an evaluation and its experiment hooks), NULL
 * when none: Lua's count hooks are per thread, so a host's SIGINT handler arms this one as well as
 * its main thread, and a hook looping inside a coroutine-run generate is interrupted too. */
extern lua_State *volatile ember_lua_running;

/* The module's entry point (lember.c): preloaded by ember-lua, exported by ember/core.so. */
LUAMOD_API int luaopen_ember_core(lua_State *L);
/* Registers what the helpers below need in a Lua state (the box metatable) and their wrappers in
 * core.internal (check_options, opt_int, opt_num) of the module table at `module` (lbind.c). */
void ember_lua_open_helpers(lua_State *L, int module);

/* Creates the metatable `tname` whose __index resolves, in order, `methods` (also kept as
 * mt.__methods so the REPL can complete them) and mt.__getters[key](self) (properties; Lua code
 * may add getters). Leaves the metatable on the stack. */
void ember_lua_new_class(lua_State *L, const char *tname, const luaL_Reg *methods, const luaL_Reg *meta,
                         const luaL_Reg *getters);

/* Adds fns to core.internal (created on first use) of the module table at `module`: the building
 * blocks lib/ember uses (generate.lua), not part of the documented `ember` API. */
void ember_lua_set_internal(lua_State *L, int module, const luaL_Reg *fns);

/* Raises "bad argument to 'fname' (unknown option 'x', did you mean 'y'? valid: a, b, c)" for any
 * key of the table at idx that is not in `valid` (NULL-terminated). Catches typos in option tables. */
void ember_lua_check_options(lua_State *L, int idx, const char *fname, const char *const *valid);
/* The entry of `valid` (NULL-terminated) nearest to word, for "did you mean": by the distance
 * below, ties broken by the plain edit distance. */
const char *ember_lua_closest(const char *word, const char *const *valid);
/* The edit distance of word and name once both are lower-cased and stripped of '_': 0 for
 * "Attention_Pattern" or "afterlayer" against a stage name, 1 for a plural. */
size_t ember_lua_fold_distance(const char *word, const char *name);

/* Optional integer field of the options table at idx; a non-integer raises naming fname/key. */
lua_Integer ember_lua_opt_int_field(lua_State *L, int idx, const char *fname, const char *key, lua_Integer def);
lua_Number ember_lua_opt_num_field(lua_State *L, int idx, const char *fname, const char *key, lua_Number def);
const char *ember_lua_opt_str_field(lua_State *L, int idx, const char *fname, const char *key, const char *def);

/* A GC-managed box for one C resource: pushes a userdata whose __gc/__close call free_fn(ptr)
 * once. Store the pointer in *box after acquiring it; nothing leaks if a later call raises. */
void **ember_lua_box(lua_State *L, void (*free_fn)(void *));

/* Milliseconds from a monotonic clock. */
double ember_lua_now_ms(void);

#endif
