/* ember_internal.h — the one engine-internal header the Lua bindings may include: what they need
 * beyond the public API (include/ember.h) and nothing more. Not part of the installed API.
 * Today: the tokenizer (until it gets its own room) and opening a GGUF file for its embedded
 * tokenizer. tests/check_layers.sh fails when a binding includes any other engine header. */
#ifndef EMBER_INTERNAL_H
#define EMBER_INTERNAL_H

#include "ember.h"

#include "../src/engine/tokenizer.h"

/* Maps and validates a GGUF file. Any malformation is an error naming the file and the problem. */
ember_status ember_gguf_open(const char *path, ember_gguf **out, ember_error *err);
void ember_gguf_close(ember_gguf *g);

#endif
