/* lib_embed.h — the Lua library compiled into ember-lua: one entry per lib/ember module, made at
 * build time by tools/embed_lua.cmake. main.c serves them through package.preload. */
#ifndef EMBER_LIB_EMBED_H
#define EMBER_LIB_EMBED_H

#include <stddef.h>

typedef struct {
    const char *name;         /* the require name: "ember", "ember.cli", "ember.experiments.x" */
    const char *chunk;        /* chunk name for messages: "@lib/ember/cli.lua" */
    const unsigned char *src; /* (len) the file's bytes, NUL-terminated */
    size_t len;
} ember_lib_module;

/* Terminated by an entry whose name is NULL. */
extern const ember_lib_module ember_lib_modules[];

#endif
