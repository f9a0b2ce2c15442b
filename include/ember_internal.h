/* ember_internal.h — the one engine-internal header the Lua bindings may include: what they need
 * beyond the public API (include/ember.h) and nothing more. Not part of the installed API.
 * Today: opening a GGUF file and reading its embedded tokenizer (the tokenizer itself is its own
 * library, src/tokenizer/tokenizer.h, included here) and the regular-file reader behind
 * ember.core.read_file, llama.cpp control-vector files (--control-vector), and the temporaries
 * rule every atomic writer follows.
 * tests/check_layers.sh fails when a binding includes any other engine header. */
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

/* (src/engine/tokenizer_gguf.c) Whether t (typically from a tokenizer.json) fits the vocabulary embedded in g:
 * EMBER_OK when g embeds none, or when t has no more ids than g, BOS agrees where both name one, t's BOS and EOS
 * are the same tokens in g, and a spread sample of ids spells the same strings. Otherwise EMBER_ERR_ARG naming
 * both files. */
ember_status ember_tokenizer_check_gguf(const ember_tokenizer *t, const ember_gguf *g, ember_error *err);

/* A llama.cpp control vector (the GGUF cvector-generator writes): its direction.N tensors in file
 * order. Read and validated by src/engine/control_vector.c; applying it is the caller's. */
typedef struct {
    int64_t n_embd;       /* width of every direction */
    int64_t n_directions; /* tensors in the file (at least 1) */
    int64_t *layers;      /* (n_directions) N of each direction.N, N >= 1 (llama.cpp's layer index) */
    float *values;        /* (n_directions, n_embd) row i = direction.layers[i] */
    char *model_hint;     /* controlvector.model_hint, NULL when absent */
    int64_t layer_count;  /* controlvector.layer_count, -1 when absent */
} ember_control_vector;

/* Reads and checks a control-vector GGUF: only direction.N tensors (N >= 1), f32, 1-D, one width;
 * general.architecture, when present, must be "controlvector". Errors name the file and tensor. */
ember_status ember_control_vector_read(const char *path, ember_control_vector **out, ember_error *err);
void ember_control_vector_free(ember_control_vector *cv);

/* The temporaries rule (src/engine/temp_name.c), its one owner: a writer's temporary beside PATH
 * is PATH.ember-tmp-BOOT-PIDNS-PID-RANDOM (this boot's id, this PID namespace, this process), and
 * a leftover one is swept only when its writer is provably dead: the same boot and PID namespace
 * and no process of that pid. Another node's, another container's, a live writer's, one whose
 * writer could not tell who it was ("0") and any name of another form are never touched. */
#define EMBER_TEMP_MARK ".ember-tmp-"
/* The name of a new temporary beside path into buf; false when it does not fit in n bytes. */
bool ember_temp_sibling(const char *path, char *buf, size_t n);
/* Whether the entry `name` (a file name, no directory) is a temporary whose writer is provably dead. */
bool ember_temp_writer_dead(const char *name);
/* Removes from dir the temporary files (never directories) whose writer is provably dead; returns
 * how many. For the engine's own writers; lib/ember sweeps its trees with fs.sweep_temps. */
int ember_temp_sweep_files(const char *dir);

#endif
