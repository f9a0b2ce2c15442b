/* types.h — the bottom of ember: weight types (GGUF's numbering), their block structs, the per-type
 * traits, row-size arithmetic, and the error slot every layer fills. Includes nothing of ember.
 *
 * Everything above (kernels, engine, bindings) takes its type knowledge from here: adding a weight
 * type is an enum value + a traits entry (type_traits.c) + its kernels (docs/kernels.md). */
#ifndef EMBER_TYPES_H
#define EMBER_TYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors: a status plus a message in a caller-owned slot ------------------------------------
 * Defined here (the bottom) so the kernels and the tokenizer can report failures without reaching
 * up into the engine; the engine, the bindings and the C API use the same slot (include/ember.h). */
typedef enum {
    EMBER_OK = 0,
    EMBER_ERR_IO,          /* a file could not be opened, mapped or read */
    EMBER_ERR_FORMAT,      /* a file is malformed (truncated, absurd count, bad magic, ...) */
    EMBER_ERR_UNSUPPORTED, /* well-formed but not supported (tensor type, family, ...) */
    EMBER_ERR_ARG,         /* a caller passed a bad argument */
    EMBER_ERR_NOMEM,       /* an allocation failed */
    EMBER_ERR_CONTEXT,     /* the session's context is full */
    EMBER_ERR_HOOK,        /* a hook reported failure; the message is the hook's */
    EMBER_ERR_NONFINITE,   /* an evaluation produced NaN or infinite logits (see allow_nonfinite) */
} ember_status;

/* Caller-owned error: the message names the function/file/field and what was wrong. */
typedef struct {
    ember_status code;
    char msg[1024];
} ember_error;

/* Fills err (if not NULL) with code and the formatted message; returns code (kernels/error.c).
 * The one formatter of every layer. */
ember_status ember_error_set(ember_error *err, ember_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- weight types -------------------------------------------------------------------------------
 * The values are GGUF's (ggml's) type ids, as stored in a file's tensor table. Naming a type here
 * does not make it usable: ember_type_traits_get() says what ember can do with it. */
typedef enum {
    EMBER_TYPE_F32 = 0,
    EMBER_TYPE_F16 = 1,
    EMBER_TYPE_Q4_0 = 2,
    EMBER_TYPE_Q4_1 = 3,
    EMBER_TYPE_Q5_0 = 6,
    EMBER_TYPE_Q5_1 = 7,
    EMBER_TYPE_Q8_0 = 8,
    EMBER_TYPE_Q8_1 = 9,
    EMBER_TYPE_Q2_K = 10,
    EMBER_TYPE_Q3_K = 11,
    EMBER_TYPE_Q4_K = 12,
    EMBER_TYPE_Q5_K = 13,
    EMBER_TYPE_Q6_K = 14,
    EMBER_TYPE_Q8_K = 15,
    EMBER_TYPE_BF16 = 30,
} ember_type;
/* One past the largest GGUF id ember knows a name for; tables indexed by type have this many
 * entries (a macro, not an enum value, so switches over ember_type need no case for it). */
#define EMBER_TYPE_COUNT 40

/* ---- blocks ---------------------------------------------------------------------------------------
 * The on-disk layout of each quantized type's block (GGUF's, little-endian; f16 fields as raw
 * uint16_t). Sizes are checked here and everything else takes them from sizeof. Only Q8_0 has
 * kernels so far; the others are here so their traits, sizes and future kernels share one
 * definition. */
#define EMBER_QK8_0 32
typedef struct {
    uint16_t d;             /* f16 scale */
    int8_t qs[EMBER_QK8_0]; /* value = d * qs[i] */
} ember_block_q8_0;
_Static_assert(sizeof(ember_block_q8_0) == 34, "q8_0 block is 34 bytes");

#define EMBER_QK4_0 32
typedef struct {
    uint16_t d;                  /* f16 scale */
    uint8_t qs[EMBER_QK4_0 / 2]; /* 4-bit quants, two per byte */
} ember_block_q4_0;
_Static_assert(sizeof(ember_block_q4_0) == 18, "q4_0 block is 18 bytes");

#define EMBER_QK4_1 32
typedef struct {
    uint16_t d, m; /* f16 scale and minimum */
    uint8_t qs[EMBER_QK4_1 / 2];
} ember_block_q4_1;
_Static_assert(sizeof(ember_block_q4_1) == 20, "q4_1 block is 20 bytes");

#define EMBER_QK5_0 32
typedef struct {
    uint16_t d;                  /* f16 scale */
    uint8_t qh[4];               /* the fifth bit of each quant */
    uint8_t qs[EMBER_QK5_0 / 2]; /* the low 4 bits, two per byte */
} ember_block_q5_0;
_Static_assert(sizeof(ember_block_q5_0) == 22, "q5_0 block is 22 bytes");

#define EMBER_QK5_1 32
typedef struct {
    uint16_t d, m;
    uint8_t qh[4];
    uint8_t qs[EMBER_QK5_1 / 2];
} ember_block_q5_1;
_Static_assert(sizeof(ember_block_q5_1) == 24, "q5_1 block is 24 bytes");

#define EMBER_QK8_1 32
typedef struct {
    uint16_t d, s; /* f16 scale and d * sum(qs) */
    int8_t qs[EMBER_QK8_1];
} ember_block_q8_1;
_Static_assert(sizeof(ember_block_q8_1) == 36, "q8_1 block is 36 bytes");

/* K quants: super-blocks of 256 values in 16 or 8 sub-blocks with quantized sub-block scales. */
#define EMBER_QK_K 256
#define EMBER_K_SCALE_SIZE 12
typedef struct {
    uint8_t scales[EMBER_QK_K / 16]; /* 4-bit scale and 4-bit minimum per sub-block of 16 */
    uint8_t qs[EMBER_QK_K / 4];      /* 2-bit quants */
    uint16_t d, dmin;                /* f16 super-block scales */
} ember_block_q2_K;
_Static_assert(sizeof(ember_block_q2_K) == 84, "q2_K block is 84 bytes");

typedef struct {
    uint8_t hmask[EMBER_QK_K / 8]; /* the high bit of each quant */
    uint8_t qs[EMBER_QK_K / 4];    /* the low 2 bits */
    uint8_t scales[EMBER_K_SCALE_SIZE];
    uint16_t d;
} ember_block_q3_K;
_Static_assert(sizeof(ember_block_q3_K) == 110, "q3_K block is 110 bytes");

typedef struct {
    uint16_t d, dmin;
    uint8_t scales[EMBER_K_SCALE_SIZE]; /* 6-bit scales and minimums of 8 sub-blocks of 32 */
    uint8_t qs[EMBER_QK_K / 2];         /* 4-bit quants */
} ember_block_q4_K;
_Static_assert(sizeof(ember_block_q4_K) == 144, "q4_K block is 144 bytes");

typedef struct {
    uint16_t d, dmin;
    uint8_t scales[EMBER_K_SCALE_SIZE];
    uint8_t qh[EMBER_QK_K / 8]; /* the fifth bit */
    uint8_t qs[EMBER_QK_K / 2]; /* the low 4 bits */
} ember_block_q5_K;
_Static_assert(sizeof(ember_block_q5_K) == 176, "q5_K block is 176 bytes");

typedef struct {
    uint8_t ql[EMBER_QK_K / 2];     /* the low 4 bits */
    uint8_t qh[EMBER_QK_K / 4];     /* the high 2 bits */
    int8_t scales[EMBER_QK_K / 16]; /* 8-bit scale per sub-block of 16 */
    uint16_t d;
} ember_block_q6_K;
_Static_assert(sizeof(ember_block_q6_K) == 210, "q6_K block is 210 bytes");

typedef struct {
    float d; /* f32 scale: the activation type of the K-quant products */
    int8_t qs[EMBER_QK_K];
    int16_t bsums[EMBER_QK_K / 16]; /* sums of each group of 16 quants */
} ember_block_q8_K;
_Static_assert(sizeof(ember_block_q8_K) == 292, "q8_K block is 292 bytes");

/* ---- traits: one entry per type (type_traits.c) ------------------------------------------------ */
typedef struct {
    const char *name;   /* "q8_0" */
    int64_t block_size; /* values per block (1 for f32/f16/bf16) */
    size_t block_bytes; /* bytes per block */
    /* Row of n values (n a multiple of block_size) as f32, exactly as stored. NULL: ember cannot
     * read this type yet (a file holding it is refused). With it, the type is a weight type: the
     * reference set multiplies it (ember_rows_reference reads only this). */
    void (*to_float)(const void *row, float *out, int64_t n);
    /* The activation type a dot product with these weights wants, and how to quantize f32
     * activations into it (the oracle form; the SIMD sets may lay the result out their own way).
     * vec_dot_type F32 with from_float NULL: products use the f32 activations as they are. */
    ember_type vec_dot_type;
    void (*from_float)(const float *x, void *y, int64_t n);
} ember_type_traits;

/* The traits of a type id as read from a file, or NULL when ember knows nothing of it. */
const ember_type_traits *ember_type_traits_get(uint32_t type);
/* A name for any GGUF type id, including ones ember refuses ("unknown" when it has none). */
const char *ember_type_name(uint32_t type);
/* Bytes of n_elements values of type t: false when t is unknown, n_elements is negative or not a
 * multiple of the block size, or the size does not fit a size_t. The one overflow-checked
 * conversion from element counts to bytes. */
bool ember_type_nbytes(ember_type t, int64_t n_elements, size_t *out);
/* The element count of a shape: the product of its n dimensions when every dimension is >= 0 and the
 * product is at most max_count; false otherwise, and no product that could overflow is ever formed
 * (2^32 x 2^32 is refused, it does not wrap to 0). The one shape product of ember's C: the GGUF
 * reader, the hyper-parameters, the Lua tensors and the results the bindings make. */
bool ember_shape_count(const int64_t *dims, int n, int64_t max_count, int64_t *out);
/* Bytes of one row of n values; 0 when ember_type_nbytes fails. */
size_t ember_type_row_size(ember_type t, int64_t n);

/* The capacity a doubling buffer grows to for `need` items: cap (`first` when cap is 0) doubled
 * until it is at least need; 0 when that would pass SIZE_MAX. The one growth rule of ember's
 * buffers (the GGUF reader's and writer's, the tokenizer's). */
static inline size_t ember_grow_cap(size_t cap, size_t first, size_t need) {
    size_t c = cap ? cap : first;
    while (c < need) {
        if (c > SIZE_MAX / 2) return 0;
        c *= 2;
    }
    return c;
}

/* ---- the value fingerprint (fingerprint.c) -----------------------------------------------------
 * FNV-1a 64 (offset basis 0xcbf29ce484222325, prime 0x100000001b3) over the little-endian bytes of
 * n f32 values in order; the shape is not included. The one fingerprint of traces, dumps and
 * activation-stats (docs/inspection.md). _start and _bytes continue a hash over any bytes (the
 * normalized trace fingerprint hashes its event lines with them). */
uint64_t ember_fingerprint_f32(const float *x, int64_t n);
uint64_t ember_fingerprint_start(void);
uint64_t ember_fingerprint_bytes(uint64_t h, const void *data, size_t n);

#ifdef __cplusplus
}
#endif
#endif
