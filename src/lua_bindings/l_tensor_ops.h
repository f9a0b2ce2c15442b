/* l_tensor_ops.h — the computing methods of ember.Tensor / ember.TensorView (l_tensor_ops.c):
 * softmax, matmul, broadcasting arithmetic, reductions, slices, heads, token-space helpers. */
#ifndef EMBER_L_TENSOR_OPS_H
#define EMBER_L_TENSOR_OPS_H

#include "lbind.h"

/* Adds the methods to both classes, their arithmetic operators, and the module functions
 * (ember.add, ember.matmul, ...). Call after ember_lua_open_tensor. */
void ember_lua_open_tensor_ops(lua_State *L, int module);

#endif
