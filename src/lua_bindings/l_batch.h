/* l_batch.h — ember.Batch (model:batch{size=, context=}): several sequences of one model evaluated
 * together (l_batch.c). */
#ifndef EMBER_L_BATCH_H
#define EMBER_L_BATCH_H

#include "l_model.h"

void ember_lua_open_batch(lua_State *L, int module);

#endif
