/* l_sampler.h — what other binding files use of ember.Sampler (a userdata over the engine's
 * sampler): the check that yields the engine object. */
#ifndef EMBER_L_SAMPLER_H
#define EMBER_L_SAMPLER_H

#include "lbind.h"

#define EMBER_LUA_SAMPLER "ember.Sampler"

void ember_lua_open_sampler(lua_State *L, int module);
/* The open sampler at index i with its vocabulary size, or raises "attempt to use a closed sampler". */
ember_sampler *ember_lua_check_sampler(lua_State *L, int i, int64_t *n_vocab);

#endif
