/* l_gradients.h — core.internal.gradients (l_gradients.c): an evaluation with a backward pass, its
 * gradients as owned Tensors. */
#ifndef EMBER_L_GRADIENTS_H
#define EMBER_L_GRADIENTS_H

#include "lbind.h"

void ember_lua_open_gradients(lua_State *L, int module);

#endif
