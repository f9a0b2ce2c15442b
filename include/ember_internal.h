/* ember_internal.h — the one engine-internal header the Lua bindings may include: what they need
 * beyond the public API (include/ember.h) and nothing more. Not part of the installed API.
 * Today: opening a GGUF file and reading its embedded tokenizer (the tokenizer itself is its own
 * library, src/tokenizer/tokenizer.h, included here) and the regular-file reader behind
 * ember.core.read_file. tests/check_layers.sh fails when a binding includes any other engine header. */
#ifndef EMBER_INTERNAL_H
#define EMBER_INTERNAL_H

#include "ember.h"

#include "tokenizer.h"

/* Maps and validates a GGUF file. Any malformation is an error naming the file and the problem. */
ember_status ember_gguf_open(const char *path, ember_gguf **out, ember_error *err);
void ember_gguf_close(ember_gguf *g);

/* The whole regular file (never a FIFO, device or directory: an error naming it) into a malloc'd,
 * NUL-terminated buffer; larger than max_bytes is refused before reading (src/engine/file.c). */
ember_status ember_file_read_all(const char *path, size_t max_bytes, char **data, size_t *len, ember_error *err);

/* The vocabulary embedded in GGUF: tokenizer.ggml.model = "gpt2" (with tokenizer.ggml.pre one of
 * gpt-2, llama-bpe, qwen2), "llama" (SentencePiece with scores) or "gemma4". The engine reads the
 * file and feeds the tokenizer's builder (src/engine/tokenizer_gguf.c). */
ember_status ember_tokenizer_from_gguf(const ember_gguf *g, ember_tokenizer **out, ember_error *err);

/* (src/engine/tokenizer_gguf.c) Whether t (typically from a tokenizer.json) fits the vocabulary embedded in g: EMBER_OK when g
 * embeds none, or when t has no more ids than g, BOS agrees where both name one, t's BOS and EOS
 * are the same tokens in g, and a spread sample of ids spells the same strings. Otherwise EMBER_ERR_ARG naming both files. */
ember_status ember_tokenizer_check_gguf(const ember_tokenizer *t, const ember_gguf *g, ember_error *err);

#endif
