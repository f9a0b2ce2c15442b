/* l_model_lens.h — the read-only research methods of ember.Model (l_model_lens.c):
 * model:unembed (the logit lens) and model:weight (a stored tensor, dequantized). */
#ifndef EMBER_L_MODEL_LENS_H
#define EMBER_L_MODEL_LENS_H

#include "lbind.h"

/* Adds unembed and weight to ember.Model's methods. Call after ember_lua_open_model. */
void ember_lua_open_model_lens(lua_State *L, int module);

#endif
