/* l_sae.h — ember.SAE (l_sae.c): an engine sparse autoencoder built from the spec lib/ember/sae
 * reads from its files, and ember.SAESites (the SAEs a runner splices in); luaopen_ember_core opens
 * them, the experiment runner takes the sites. */
#ifndef EMBER_L_SAE_H
#define EMBER_L_SAE_H

#include "lbind.h"

#define EMBER_LUA_SAE "ember.SAE"

/* Sets module.sae_new and the ember.SAE class. */
void ember_lua_open_sae(lua_State *L, int module);
/* The open SAE at index i, or raises "attempt to use a closed SAE". */
ember_sae *ember_lua_check_sae(lua_State *L, int i);
/* The ember.SAESites (core.sae_sites) at index i: SAEs spliced into a runner's evaluations. */
ember_sae_sites *ember_lua_check_sae_sites(lua_State *L, int i);

#endif
