/* gguf_writer.h — a small GGUF v3 writer for tools and tests: typed metadata (nested arrays too) and
 * tensors in F32/F16/BF16/Q8_0 and the 4- to 6-bit types (quants.h). It builds the whole file in
 * memory; not meant for large models.
 *
 * Layout written (the reader's gguf.h describes the format): header, metadata in the order set,
 * tensor infos in the order added, zero padding to general.alignment (32 unless set), then each
 * tensor's data at an aligned offset, each followed by zero padding to the alignment.
 * The file is written to a temporary name beside the target and renamed into place, so a reader
 * never sees a half-written model.
 *
 * Errors are sticky: the first failed call is remembered and ember_gguf_writer_write() reports it,
 * so builders can make many calls and check once.
 */
#ifndef EMBER_GGUF_WRITER_H
#define EMBER_GGUF_WRITER_H

#include "gguf.h"

typedef struct ember_gguf_writer ember_gguf_writer;

/* A serialized metadata value (type + payload bytes), built bottom-up for nested arrays.
 * Arrays copy their items, so items may be freed right after use. */
typedef struct ember_gguf_wvalue ember_gguf_wvalue;

ember_gguf_writer *ember_gguf_writer_new(void); /* NULL when out of memory */
void ember_gguf_writer_free(ember_gguf_writer *w);
/* 3 by default; 2 has the same layout and exists so readers can be tested on v2 files. */
void ember_gguf_writer_set_version(ember_gguf_writer *w, uint32_t version);
/* The first error recorded (EMBER_OK if none); its message is copied into err. */
ember_status ember_gguf_writer_status(const ember_gguf_writer *w, ember_error *err);

/* ---- metadata values ---- */
/* A scalar of any numeric type or bool; `v` points to a value of that type's C size
 * (uint8_t, int8_t, ..., float, bool as uint8_t/bool, double). */
ember_gguf_wvalue *ember_gguf_wvalue_scalar(gguf_value_type t, const void *v);
ember_gguf_wvalue *ember_gguf_wvalue_string(const char *s, size_t len);
/* An array of `count` scalars of elem_type, packed as in C (e.g. int32_t[count]). */
ember_gguf_wvalue *ember_gguf_wvalue_array(gguf_value_type elem_type, const void *elems, uint64_t count);
/* An array of strings or of arrays: each item must have type elem_type. NULL if not. */
ember_gguf_wvalue *ember_gguf_wvalue_array_of(gguf_value_type elem_type, ember_gguf_wvalue *const *items,
                                              uint64_t count);
gguf_value_type ember_gguf_wvalue_type(const ember_gguf_wvalue *v);
void ember_gguf_wvalue_free(ember_gguf_wvalue *v);

/* Sets `key` (a new key; setting an existing key is an error). NULL `v` records an error (it is
 * what a failed wvalue constructor returns). */
ember_status ember_gguf_writer_set(ember_gguf_writer *w, const char *key, const ember_gguf_wvalue *v);
/* Shorthands for the common cases. */
ember_status ember_gguf_writer_set_u32(ember_gguf_writer *w, const char *key, uint32_t v);
ember_status ember_gguf_writer_set_i32(ember_gguf_writer *w, const char *key, int32_t v);
ember_status ember_gguf_writer_set_u64(ember_gguf_writer *w, const char *key, uint64_t v);
ember_status ember_gguf_writer_set_f32(ember_gguf_writer *w, const char *key, float v);
ember_status ember_gguf_writer_set_bool(ember_gguf_writer *w, const char *key, bool v);
ember_status ember_gguf_writer_set_string(ember_gguf_writer *w, const char *key, const char *s);
ember_status ember_gguf_writer_set_array(ember_gguf_writer *w, const char *key, gguf_value_type elem_type,
                                         const void *elems, uint64_t count);
ember_status ember_gguf_writer_set_strings(ember_gguf_writer *w, const char *key, const char *const *s, uint64_t count);
/* Removes a key or a tensor; false when there was none. Lets tests derive broken files. */
bool ember_gguf_writer_remove_key(ember_gguf_writer *w, const char *key);
bool ember_gguf_writer_remove_tensor(ember_gguf_writer *w, const char *name);

/* ---- tensors ---- */
/* Adds a tensor of n_dims (1..4) dims ne (ne[0] fastest) from f32 values, converted to `type`
 * (Q8_0: blocks of 32 along ne[0], d = absmax/127 stored as f16, q = round(x/d); Q4_0, Q4_1, Q5_0,
 * Q5_1, Q2_K..Q6_K: the project's quantizers, the bytes llama-quantize writes for the same values). */
ember_status ember_gguf_writer_add_tensor(ember_gguf_writer *w, const char *name, ember_type type, uint32_t n_dims,
                                          const int64_t *ne, const float *values);
/* Adds `size` bytes as they are under any ggml type number, valid or not: for tests that need
 * tensors ember must refuse. */
ember_status ember_gguf_writer_add_tensor_raw(ember_gguf_writer *w, const char *name, uint32_t ggml_type,
                                              uint32_t n_dims, const int64_t *ne, const void *data, size_t size);

/* Converts n f32 values (n a multiple of 32) to Q8_0 blocks. */
void ember_quantize_q8_0(const float *x, ember_block_q8_0 *out, int64_t n);

/* Writes the file (temporary name, then rename). Fails with the first recorded error, if any. */
ember_status ember_gguf_writer_write(ember_gguf_writer *w, const char *path, ember_error *err);

#endif
