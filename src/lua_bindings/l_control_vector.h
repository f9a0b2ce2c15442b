/* l_control_vector.h — core.read_control_vector (l_control_vector.c): a llama.cpp control-vector
 * GGUF read by the engine, handed to Lua as tensors; luaopen_ember_core opens it. */
#ifndef EMBER_L_CONTROL_VECTOR_H
#define EMBER_L_CONTROL_VECTOR_H

#include "lbind.h"

/* Sets module.read_control_vector. */
void ember_lua_open_control_vector(lua_State *L, int module);

#endif
