/* l_tokenizer.h — the Lua face of the tokenizer: the ember.Tokenizer and ember.DetokStream
 * userdata, and the helpers the model bindings use for model:tokenize / detokenize / generate. */
#ifndef EMBER_L_TOKENIZER_H
#define EMBER_L_TOKENIZER_H

#include <lauxlib.h>
#include <lua.h>

#include "ember_internal.h"

#define EMBER_LUA_TOKENIZER "ember.Tokenizer"
#define EMBER_LUA_DETOK "ember.DetokStream"

/* Registers both classes and adds to the ember.core table at module_index:
 *   core.tokenizer_from_gguf(path)  -> ember.Tokenizer (raises on error)
 *   core.tokenizer_build(spec)      -> ember.Tokenizer; spec is what lib/ember/model/tokenizer.lua
 *                                      makes of a tokenizer.json (see l_tokenizer.c) */
void ember_lua_open_tokenizer(lua_State *L, int module_index);

/* The open tokenizer at idx, or raises "attempt to use a closed tokenizer". The pointer is valid
 * until Lua code runs again (a script may close the tokenizer): check again after any call into
 * Lua instead of keeping it. */
ember_tokenizer *ember_lua_check_tokenizer(lua_State *L, int idx);

/* Pushes a new ember.Tokenizer that owns t (t is freed by close/__gc). */
void ember_lua_push_tokenizer(lua_State *L, ember_tokenizer *t);

/* tok:encode(text [, {bos=, special=}]) for any binding: pushes the ids table. text_idx holds the
 * string, opts_idx the options table or 0 / a nil slot. fname names the caller in errors. */
int ember_lua_tokenizer_encode(lua_State *L, ember_tokenizer *t, int text_idx, int opts_idx, const char *fname);
/* tok:decode(ids [, {special=}]) for any binding: pushes the text. */
int ember_lua_tokenizer_decode(lua_State *L, ember_tokenizer *t, int ids_idx, int opts_idx, const char *fname);

#endif
