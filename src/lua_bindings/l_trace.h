/* l_trace.h — ember.Trace (a structured trace file written by the engine) as other binding files
 * see it: the opener for lember.c. */
#ifndef EMBER_L_TRACE_H
#define EMBER_L_TRACE_H

#include "lbind.h"

#define EMBER_LUA_TRACE "ember.Trace"

void ember_lua_open_trace(lua_State *L, int module);
/* Detaches the trace of the session at idx, if any (its close and __gc call it). */
void ember_lua_trace_detach(lua_State *L, int idx);

#endif
