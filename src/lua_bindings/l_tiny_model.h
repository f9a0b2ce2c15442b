/* l_tiny_model.h — ember.make_tiny_model (l_tiny_model.c), the project's tiny-model generator as a
 * module function of `ember.core`; luaopen_ember_core opens it. */
#ifndef EMBER_L_TINY_MODEL_H
#define EMBER_L_TINY_MODEL_H

#include "lbind.h"

/* Sets module.make_tiny_model. */
void ember_lua_open_tiny_model(lua_State *L, int module);

#endif
