/* l_model.h — what other binding files use of ember.Model: the userdata layout, the open-model
 * check, the session count that keeps the engine model alive, and the model's tokenizer. */
#ifndef EMBER_L_MODEL_H
#define EMBER_L_MODEL_H

#include "lbind.h"

#define EMBER_LUA_MODEL "ember.Model"

typedef struct {
    ember_model *m;       /* NULL once freed */
    bool closed;          /* what Lua sees: closed models raise even while sessions keep m alive */
    int64_t n_sessions;   /* sessions and SAEs pointing into m: m is freed after the last one */
    ember_digest *digest; /* the file's SHA-256, started at load or on first request; NULL before */
    bool verify_model;    /* load{verify_model=true}: the digest never comes from the cache */
} ember_lua_model;

void ember_lua_open_model(lua_State *L, int module);
/* The open model at index i, or raises "attempt to use a closed model". */
ember_lua_model *ember_lua_check_model(lua_State *L, int i);
/* A session that pointed into the model was freed; frees the model if it was closed meanwhile. */
void ember_lua_model_release(ember_lua_model *lm);
/* Pushes the model's tokenizer, or raises "<fname>: the model has no tokenizer (<why>) ...". */
void ember_lua_model_need_tokenizer(lua_State *L, int idx, const char *fname);
/* Pushes model.info (a table built once at load); works on a closed model too. */
void ember_lua_push_model_info(lua_State *L, int model_idx);

#endif
