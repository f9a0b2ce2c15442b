/* l_session.h — what other binding files use of ember.Session: the layout and the constructor
 * (model:session and generate make sessions; l_session.c owns everything else about them). */
#ifndef EMBER_L_SESSION_H
#define EMBER_L_SESSION_H

#include "l_model.h"

#define EMBER_LUA_SESSION "ember.Session"

typedef struct {
    ember_session *s;       /* NULL once closed */
    ember_lua_model *model; /* kept alive by the session's user value */
    bool busy;              /* an evaluation (and so maybe a hook) is running on this session */
} ember_lua_session;

void ember_lua_open_session(lua_State *L, int module);
/* Pushes a new session over the model at model_idx (n_ctx <= 0: engine default). fname names
 * the caller in errors. */
ember_lua_session *ember_lua_new_session(lua_State *L, int model_idx, int64_t n_ctx, const char *fname);

#endif
