/* gguf.h — a hostile-input reader for GGUF v2/v3 files: mmap, typed metadata, tensor table.
 * Knows nothing of models; every count, length and offset is bounds-checked before use.
 *
 * On-disk format (all little-endian):
 *   u32 magic "GGUF" | u32 version (2 or 3) | u64 n_tensors | u64 n_kv
 *   n_kv times:      string key | u32 value_type | value
 *   n_tensors times: string name | u32 n_dims (1..4) | u64 dims[n_dims] | u32 ggml_type | u64 offset
 *   padding to general.alignment (default 32, a power of two)
 *   tensor data: each tensor at data_start + offset, offset a multiple of the alignment
 * string = u64 length + bytes (no NUL). value types: 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32,
 * 6 f32, 7 bool, 8 string, 9 array (u32 elem_type, u64 count, elems), 10 u64, 11 i64, 12 f64.
 * Arrays may nest (an array of arrays).
 * dims[0] is the fastest-moving (column) dimension: a matrix with dims {n_in, n_out} stores
 * n_out rows of n_in values.
 */
#ifndef EMBER_GGUF_H
#define EMBER_GGUF_H

#include "ember.h"
#include "ember_internal.h"

typedef enum {
    GGUF_TYPE_UINT8 = 0,
    GGUF_TYPE_INT8 = 1,
    GGUF_TYPE_UINT16 = 2,
    GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4,
    GGUF_TYPE_INT32 = 5,
    GGUF_TYPE_FLOAT32 = 6,
    GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8,
    GGUF_TYPE_ARRAY = 9,
    GGUF_TYPE_UINT64 = 10,
    GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12,
    GGUF_TYPE_COUNT
} gguf_value_type;

/* Tensor element types (ember_type, GGUF's numbering), their blocks, names and row sizes are the
 * kernels' (kernels/types.h, reached through ember.h). */

const char *gguf_value_type_name(gguf_value_type t); /* "u32", "string", ... */

typedef struct {
    const char *ptr; /* not NUL-terminated: points into the mapping */
    uint64_t len;
} gguf_str;

/* A metadata value. Arrays keep a pointer to their raw elements in the mapping. */
typedef struct gguf_value {
    gguf_value_type type;
    union {
        uint64_t u64;
        int64_t i64;
        double f64;
        bool b;
        gguf_str str;
        struct {
            gguf_value_type elem_type;
            uint64_t count;
            const uint8_t *data;      /* raw elements (strings: u64 len + bytes each) */
            struct gguf_value *items; /* parsed items for arrays of arrays, else NULL */
            uint64_t *str_off;        /* strings: (count) where item i's length starts, from data;
                                         * 8 bytes an item (a vocabulary and its merges are 300k) */
        } arr;
    } v;
} gguf_value;

typedef struct {
    gguf_str key;
    gguf_value value;
} gguf_kv;

typedef struct {
    char *name; /* NUL-terminated copy */
    uint32_t n_dims;
    int64_t ne[4];      /* ne[0] fastest; unused dims are 1 */
    int64_t n_elements; /* ne[0] x .. x ne[3], checked (ember_shape_count) */
    ember_type type;
    uint64_t offset;  /* relative to the data section */
    size_t size;      /* bytes */
    const void *data; /* into the mapping */
} gguf_tensor;

/* Open addressing from a name to its index in kv[] or tensors[]: duplicate checks and lookups in
 * constant time. */
typedef struct {
    uint32_t *slots; /* (cap) index + 1, 0 = empty */
    size_t cap;      /* power of two, at least twice the entries */
} gguf_index;

struct ember_gguf {
    char *path;
    const uint8_t *base; /* the mapping */
    size_t size;
    int fd;    /* kept open: fstat tells whether the file changed since it was mapped */
    int guard; /* mapguard slot (mapguard.h), -1 when unguarded */
    uint64_t st_dev, st_ino;
    int64_t st_mtime_ns;
    gguf_index kv_index, tensor_index;
    int64_t n_blocks;   /* layers 0..n_blocks-1 each have a tensor named "blk.N.*" (0 when none) */
    int64_t max_extent; /* the largest dimension of any tensor (bounds hyper-parameters) */
    uint32_t version;
    uint64_t n_kv, n_tensors;
    gguf_kv *kv;          /* (n_kv) */
    gguf_tensor *tensors; /* (n_tensors) */
    uint64_t alignment;
    uint64_t data_offset;
};

/* ember_gguf_open / ember_gguf_close are declared in ember_internal.h (the bindings open files
 * for the embedded tokenizer). */
/* EMBER_OK while the mapped file is as it was when opened; an EMBER_ERR_IO naming the file once
 * it has been truncated, replaced in place, or a read of the mapping has faulted (a truncation
 * raced with an evaluation: the pages read as zeros, see mapguard.h). */
ember_status ember_gguf_check_unchanged(const ember_gguf *g, ember_error *err);
/* Asks the kernel to start reading the tensor data ahead (first-touch page faults on a mapping are
 * slow on virtual machines); a hint only: failure changes nothing. */
void ember_gguf_advise_willneed(const ember_gguf *g);
/* Copies n bytes of the file at the mapped address p (inside the mapping) into dst by reading the
 * file, so that no page of the mapping becomes resident (embedding.c). */
void ember_gguf_read(const ember_gguf *g, const void *p, void *dst, size_t n);

const gguf_kv *ember_gguf_find(const ember_gguf *g, const char *key);
const gguf_tensor *ember_gguf_find_tensor(const ember_gguf *g, const char *name);

/* Typed lookups. Missing key -> `def` (or NULL) and false; wrong type -> error. Integers of any
 * integer type convert when the value fits. */
bool ember_gguf_get_int(const ember_gguf *g, const char *key, int64_t *out);
bool ember_gguf_get_float(const ember_gguf *g, const char *key, double *out);
bool ember_gguf_get_bool(const ember_gguf *g, const char *key, bool *out);
/* Returns a freshly allocated NUL-terminated copy, or NULL when absent or not a string. */
char *ember_gguf_get_string(const ember_gguf *g, const char *key);
/* Numeric array element i as double/int; false when out of range or not numeric. */
bool ember_gguf_array_number(const gguf_value *arr, uint64_t i, double *out);
/* String array element i; false when out of range or not a string array. */
bool ember_gguf_array_string(const gguf_value *arr, uint64_t i, gguf_str *out);

bool gguf_str_eq(gguf_str s, const char *c);

#endif
