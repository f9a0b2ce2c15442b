/* kernels.h — the numeric operations of a forward pass, as one table per kernel set, and the
 * compute context that threads them. Two levels of dispatch: a kernel set is chosen by the CPU
 * (dispatch.c), and inside a set matrix products are looked up by weight type (`mm[type]`); what
 * is known of each type lives in the traits table (types.h, type_traits.c). No model knowledge,
 * and nothing from the engine or above: this header and types.h/cpu.h/threads.h are the kernels'
 * whole interface.
 *
 * Kernel sets:
 *   reference  ref.c     scalar C, every op as written in the model's maths (the oracle)
 *   avx2       avx2.c    AVX2 + FMA + F16C
 *   avx512     avx512.c  AVX-512 F/BW/VL + VNNI
 * avx2 and avx512 compute bit-identical results for every op (docs/kernels.md gives the common
 * order of operations), so "auto" agrees across machines that pick either. */
#ifndef EMBER_KERNELS_H
#define EMBER_KERNELS_H

#include "cpu.h"
#include "threads.h"
#include "types.h"

#include <math.h>

/* A weight matrix used in place from the mapping: n_out rows of n_in values, row-major. */
typedef struct {
    ember_type type;
    const void *data; /* (n_out, n_in) in `type` */
    int64_t n_in, n_out;
    size_t row_bytes;
    const void *packed; /* the same weights repacked by the model's kernel set, or NULL (see
                           ember_compute_pack); `data` stays valid and is what the reference reads */
} ember_matrix;

float ember_f16_to_f32(uint16_t h);
uint16_t ember_f32_to_f16(float f); /* round to nearest even */
float ember_bf16_to_f32(uint16_t h);
uint16_t ember_f32_to_bf16(float f); /* round to nearest even */

/* ---- Q8_0 activation quantization (the fast path's scheme for Q8_0 weights, llama.cpp's) ----
 * Per block of 32 values: amax = max|x|, d = amax / 127 stored as f16 (round to nearest even),
 * q = round-half-even(x * (127 / amax)) in [-127, 127] (0 when amax is 0). A block holding a NaN or
 * an infinity gets d = NaN and q = 0, so the product comes out NaN instead of silently finite.
 * n must be a multiple of 32. (The Q8_0 traits' from_float.) */
void ember_quantize_row_q8_0(const float *x, ember_block_q8_0 *y, int64_t n);
/* Reference product of a Q8_0 weight row and a quantized activation row: per block the exact
 * integer sum of the 32 products, then s += (f32(d_w) * f32(d_x)) * isum in block order. */
float ember_dot_q8_0_q8_0(const ember_block_q8_0 *w, const ember_block_q8_0 *x, int64_t n);

/* Q8_1 (the activations of the Q4_1/Q5_1 products): the Q8_0 quantization above (same d and quants,
 * NaN blocks likewise) plus s = f16((amax / 127) * sum of the quants), the unrounded d as in
 * llama.cpp's x86 quantize_row_q8_1. (The Q8_1 traits' from_float.) */
void ember_quantize_row_q8_1(const float *x, ember_block_q8_1 *y, int64_t n);
/* Q8_K activations of the K-quant products: ember_quantize_row_q8_k (ggml's reference, bit for bit)
 * on finite blocks; a block holding a NaN or an infinity gets d = NaN and zero quants and sums, so
 * the products come out NaN. n a multiple of 256. */
void ember_quantize_act_q8_k(const float *x, void *y, int64_t n);

/* The most tokens one product-rows call carries (ember_matmul slices longer runs). */
#define EMBER_MATMUL_MAX_TOKENS 64

/* Rows [o0, o1) of y = x W^T for every token (n_tok <= EMBER_MATMUL_MAX_TOKENS): y (n_tok, n_out),
 * x (n_tok, n_in) f32; xa: the prepared rows `xa_stride` bytes apart, or NULL when the type's
 * act_size is NULL. Reads w->packed when set (o0 is then a multiple of 16). */
typedef void (*ember_rows_fn)(const ember_matrix *w, const float *x, const void *xa, size_t xa_stride, float *y,
                              int64_t n_tok, int64_t o0, int64_t o1);

/* ---- the transposed product: the activation gradients of y = x W^T, dx = g W ----
 * The rows of W are cut into chunks of EMBER_MATMUL_T_CHUNK from row 0. For every token t and column
 * i, chunk c's partial is s_c = sum over its rows o, in increasing o, of g[t,o] * w[o,i], starting
 * at +0, each product rounded to f32 and then added (no fused multiply-add); then dx[t,i] = s_0 and
 * dx[t,i] = dx[t,i] + s_c for c = 1, 2, ... in order. The weights are read as f32 exactly (the
 * type's to_float). Every set computes this same sequence for every element, so reference, avx2
 * and avx512 give bit-identical results for any thread count and tiling (docs/kernels.md) — but for
 * Q8_0 on the SIMD sets, which run the fast order instead: per token t, block b of 32 columns and
 * chunk c, h[o] = g[t,o] * d[o,b] (the row's block scale), amax = max |h|, s = amax / 127 and
 * hq[o] = rint(h[o] * (127 / amax)) (s = 0, hq = 0 when amax < 2^-120; s = NaN when amax is not
 * finite), the exact integer sum S = sum hq[o] * q[o,i], then s * S (rounded) folded as above.
 * avx2 and avx512 are bit-identical there; the reference is within the quantization of h. */
#define EMBER_MATMUL_T_CHUNK 64
/* Columns [i0, i1) of dx (n_tok, n_in) = g (n_tok, n_out) W, for n_tok tokens: i0 is a multiple of
 * the type's block size and i1 is too (or n_in). Reads w->data (the file's layout), never w->packed. */
typedef void (*ember_rows_t_fn)(const ember_matrix *w, const float *g, float *dx, int64_t n_tok, int64_t i0,
                                int64_t i1);

/* One kernel set's matrix product for one weight type. A NULL `rows` means this set has no
 * product for the type: loading a model that needs one is an EMBER_ERR_UNSUPPORTED error
 * (ember_compute_reserve), never a fallback to another type's code. */
typedef struct {
    /* Bytes one token's activations take once prepared for these weights (the set's layout of the
     * traits' vec_dot_type), and the preparation of one token (n_in values). NULL: the products
     * use the f32 activations as they are. */
    size_t (*act_size)(int64_t n_in);
    void (*act_prepare)(const float *x, void *xa, int64_t n_in);
    ember_rows_fn rows;
    /* Optional repacking into this set's layout (NULL: the file layout only). pack_size: bytes
     * needed. pack: fills dst (64-byte aligned) from w->data; results must equal the unpacked
     * path's bit for bit. The layout must be one run per group of 4 rows (pack_size of 4 rows
     * each), so groups can be packed in parallel. */
    size_t (*pack_size)(const ember_matrix *w);
    void (*pack)(const ember_matrix *w, void *dst);
} ember_type_kernels;

/* ---- attention over a KV cache, chunk by chunk ----
 * Keys are cut into chunks of EMBER_ATTN_CHUNK positions (multiples of it from position 0); a
 * kernel computes, for up to EMBER_ATTN_MAX_ROWS query rows sharing one KV head, each row's
 * partial over one chunk, and ember_compute_attention folds the chunks in order (compute.c). */
#define EMBER_ATTN_CHUNK 256
#define EMBER_ATTN_MAX_ROWS 8

typedef struct {
    const float *q[EMBER_ATTN_MAX_ROWS];                      /* row r's query (hd values) */
    int64_t lo[EMBER_ATTN_MAX_ROWS], hi[EMBER_ATTN_MAX_ROWS]; /* keys lo[r] <= j < hi[r] are visible to row r */
    int n_rows;
    const void *k, *v;  /* this KV head's keys and values: key j starts at element j * kv_stride */
    int64_t kv_stride;  /* elements from one position to the next */
    ember_type kv_type; /* EMBER_TYPE_F32, EMBER_TYPE_F16 or EMBER_TYPE_BF16 */
    int64_t hd;
    float scale;   /* multiplies q . k */
    float softcap; /* > 0: the scores are capped, s = softcap * tanh(s / softcap) (Gemma 2); 0: not */
} ember_attn_rows;

/* s[i] = cap * tanh(s[i] / cap) for i < n, with libm's tanhf: the attention logit softcap every
 * kernel set applies to its scores the same way (ref.c). */
void ember_attn_softcap(float *s, int64_t n, float cap);

/* For each row r, over its visible keys j in [k0, k1): s_j = (q_r . k_j) * scale (then capped
 * when softcap > 0), m[r] = max s_j,
 * e_j = exp(s_j - m[r]), l[r] = sum e_j and acc[r*hd + d] = sum e_j v_j[d]. A row with no visible
 * key in the chunk gets m[r] = -INFINITY (its l and acc are then meaningless). A row whose scores
 * hold a NaN, or whose maximum is not finite (+inf, or every score -inf: softmax is undefined),
 * gets m[r] = NaN (ember_attn_partial_max), and the fold makes that row's output NaN, so the
 * evaluation's non-finite check sees it. scores: (EMBER_ATTN_MAX_ROWS, EMBER_ATTN_CHUNK) scratch.
 * k1 - k0 <= EMBER_ATTN_CHUNK. */
typedef void (*ember_attn_chunk_fn)(const ember_attn_rows *a, int64_t k0, int64_t k1, float *scores, float *m, float *l,
                                    float *acc);

/* The m[r] a chunk kernel reports for a row with visible keys, from the maximum mx of its scores and
 * the sum of their exp(s_j - mx): mx when both are usable, else NaN. A NaN score is found through
 * the sum (every set's exp passes NaN through, so e_j and the sum are NaN), which costs nothing in
 * the loops; a maximum that is not finite is non-finite itself. The one rule of every kernel set. */
static inline float ember_attn_partial_max(float mx, float sum) { return isfinite(mx) && !isnan(sum) ? mx : NAN; }

typedef struct {
    const char *name;
    /* matrix products, indexed by weight type (types.h ids) */
    ember_type_kernels mm[EMBER_TYPE_COUNT];
    /* true: a type with no entry in mm whose traits have a to_float is multiplied by
     * ember_product_reference (the reference set: its products are read off the traits table),
     * and likewise transposed by ember_rows_t_reference (ember_kernels_mm_t). */
    bool mm_by_traits;
    float (*dot_f32)(const float *a, const float *b, int64_t n);
    /* transposed products (the backward pass), indexed by weight type; NULL: none for the type */
    ember_rows_t_fn mm_t[EMBER_TYPE_COUNT];

    /* Attention partials of the query rows `a` over the keys [k0, k1) of one chunk (contract
     * below). */
    ember_attn_chunk_fn attn_chunk;

    /* ---- small ops (same meaning as the ember_* reference functions below) ---- */
    void (*rmsnorm)(float *y, const float *x, const float *w, int64_t n, float eps);
    /* y = (x - mean) / sqrt(var + eps) * w + b: ember_layernorm on every set */
    void (*layernorm)(float *y, const float *x, const float *w, const float *b, int64_t n, float eps);
    /* g[i] = silu(g[i]) * u[i] */
    void (*silu_mul)(float *g, const float *u, int64_t n);
    /* g[i] = gelu_tanh(g[i]) * u[i]; u NULL: g[i] = gelu_tanh(g[i]) */
    void (*gelu_mul)(float *g, const float *u, int64_t n);
    /* The same with the reference formula (libm tanhf, ember_gelu_tanh) on every set: gemma4's
     * per-layer input gate has always used it, and its results must not move. */
    void (*gelu_mul_ref)(float *g, const float *u, int64_t n);
    /* RoPE on n_heads consecutive heads of hd values each (ember_rope on every head) */
    void (*rope_heads)(float *x, int64_t n_heads, int64_t hd, int64_t n_rot, int64_t pos, float base, bool neox,
                       const float *freq_factors);
    /* Row r of m as f32 (n_in values), through the type's to_float: embedding lookups. */
    void (*get_row)(const ember_matrix *m, int64_t r, float *out);
    /* y[i] = ember_f32_to_f16(x[i]) / ember_f32_to_bf16(x[i]) for i < n, bit for bit on every set:
     * keys and values stored into an f16 / bf16 KV cache. */
    void (*f32_to_f16_row)(uint16_t *y, const float *x, int64_t n);
    void (*f32_to_bf16_row)(uint16_t *y, const float *x, int64_t n);
} ember_kernel_ops;

extern const ember_kernel_ops ember_kernels_reference;
extern const ember_kernel_ops ember_kernels_avx2; /* call only when ember_kernels_supported() */
extern const ember_kernel_ops ember_kernels_avx512;
/* rope.c: ember_rope on every head with the angles computed once per call; bit-identical to the
 * reference (same double-precision angles, same f32 rotation), used by the SIMD sets. */
void ember_rope_heads_fast(float *x, int64_t n_heads, int64_t hd, int64_t n_rot, int64_t pos, float base, bool neox,
                           const float *freq_factors);
/* ref.c: the reference product of any type with a to_float (rows of y = x W^T): each weight row is
 * dequantized exactly, a chunk at a time, and multiplied with the f32 activations, s += w_i * x_i
 * in increasing i. */
void ember_rows_reference(const ember_matrix *w, const float *x, const void *xa, size_t xa_stride, float *y,
                          int64_t n_tok, int64_t o0, int64_t o1);
/* ref.c: the reference transposed product of any type with a to_float (the order above). */
void ember_rows_t_reference(const ember_matrix *w, const float *g, float *dx, int64_t n_tok, int64_t i0, int64_t i1);
/* The explicit fallback list: weight types for which the SIMD sets have no kernels of their own and
 * run the reference product (dequantize exactly, f32 dot with the f32 activations; bit-identical
 * to the reference set). Only Q2_K and Q3_K are left: Q4_0/Q4_1/Q5_0/Q5_1/Q4_K/Q5_K/Q6_K have
 * integer kernels (quant_dots.h; docs/kernels.md, "The fast path of the 4- to 6-bit types"). */
#define EMBER_MM_REFERENCE_PRODUCTS                                                                                    \
    [EMBER_TYPE_Q2_K] = {.rows = ember_rows_reference}, [EMBER_TYPE_Q3_K] = {.rows = ember_rows_reference}
/* ref.c: the get_row every set uses (the type's traits to_float; exact). */
void ember_matrix_get_row(const ember_matrix *m, int64_t r, float *out);
/* ref.c: the reference rows of f32_to_f16_row / f32_to_bf16_row (the scalar conversions above). */
void ember_f32_to_f16_row(uint16_t *y, const float *x, int64_t n);
void ember_f32_to_bf16_row(uint16_t *y, const float *x, int64_t n);
/* ref.c: the gelu_mul_ref every set uses. */
void ember_gelu_mul_ref(float *g, const float *u, int64_t n);

/* ref.c: { .rows = ember_rows_reference }, the product of every type of the reference set. */
extern const ember_type_kernels ember_product_reference;

/* The transposed product of set `ops` for weights of type t, or NULL when it has none: its table's
 * entry, else (mm_by_traits) ember_rows_t_reference for every type whose traits have a to_float. */
static inline ember_rows_t_fn ember_kernels_mm_t(const ember_kernel_ops *ops, ember_type t) {
    if ((unsigned)t >= EMBER_TYPE_COUNT) return NULL;
    if (ops->mm_t[t]) return ops->mm_t[t];
    const ember_type_traits *tr = ops->mm_by_traits ? ember_type_traits_get((uint32_t)t) : NULL;
    return tr && tr->to_float ? ember_rows_t_reference : NULL;
}

/* The product of set `ops` for weights of type t, or NULL when it has none. */
static inline const ember_type_kernels *ember_kernels_mm(const ember_kernel_ops *ops, ember_type t) {
    if ((unsigned)t >= EMBER_TYPE_COUNT) return NULL;
    if (ops->mm[t].rows) return &ops->mm[t];
    const ember_type_traits *tr = ops->mm_by_traits ? ember_type_traits_get((uint32_t)t) : NULL;
    return tr && tr->to_float ? &ember_product_reference : NULL;
}

/* ---- kernel variants: what a trace records for each op (variant.c) ---- */
typedef enum {
    EMBER_KOP_GET_ROW = 0, /* embedding lookups */
    EMBER_KOP_RMSNORM,
    EMBER_KOP_LAYERNORM,
    EMBER_KOP_SILU_MUL,
    EMBER_KOP_GELU_MUL,
    EMBER_KOP_GELU_MUL_REF,
    EMBER_KOP_ROPE,
    EMBER_KOP_ATTENTION,         /* the fused chunked attention (attn_chunk) */
    EMBER_KOP_ATTENTION_PATTERN, /* attention_probs + attention_mix, shared by every set */
    EMBER_KOP_ENGINE,            /* the engine's own element loops (residual adds, biases, scales) */
    EMBER_KOP_PRODUCT            /* a matrix product: named by ember_kernels_product_variant */
} ember_kop;
/* "reference" when set `ops` runs the reference function for op, its own name otherwise, "shared"
 * for code every set shares. A static string. */
const char *ember_kernels_op_variant(const ember_kernel_ops *ops, ember_kop op);
/* The product of ops for w: "<set>/<type>" + "_x4" when w is repacked; a type on the fallback list
 * names "reference". Written into buf (32 bytes are enough). */
void ember_kernels_product_variant(const ember_kernel_ops *ops, const ember_matrix *w, char *buf, size_t n);
/* The activations that product multiplies with: "f32" or the quantized block type ("q8_0", ...). */
const char *ember_kernels_product_activations(const ember_kernel_ops *ops, const ember_matrix *w);

/* The table of a set this CPU can run (NULL for auto or a set it cannot run). */
const ember_kernel_ops *ember_kernels_table(ember_kernels k);
/* Resolves a requested set: AUTO takes EMBER_KERNELS (ember_kernels_env; a bad value is an error)
 * and then the best set (ember_kernels_best). An explicit request the CPU cannot run is an
 * EMBER_ERR_UNSUPPORTED error naming the missing features; *chosen names the set asked for. */
ember_status ember_kernels_resolve(ember_kernels want, ember_kernels *chosen, const ember_kernel_ops **ops,
                                   ember_error *err);
/* ember_kernels_resolve without the message: the table, or NULL. */
const ember_kernel_ops *ember_kernels_select(ember_kernels want, ember_kernels *chosen);

/* ---- the compute context: a kernel table, a thread pool and scratch, one per model ---- */
typedef struct ember_compute ember_compute;

/* Resolves `want` as ember_kernels_resolve does and starts n_threads threads. */
ember_status ember_compute_new(ember_kernels want, int n_threads, ember_compute **out, ember_error *err);
void ember_compute_free(ember_compute *c);
/* Repacks w into the compute's kernel layout if that set has one for w's type (sets w->packed; the
 * copy belongs to c). release_source: w->data is a read-only file mapping whose pages may be
 * released from this process after the copy (they are re-read from the file if an embedding
 * lookup needs them), so resident memory stays about one copy of the weights; never pass true for
 * malloc'd weights. EMBER_WEIGHTS=mapped in the environment disables repacking (the weights are
 * then read in place from the mapping). */
ember_status ember_compute_pack(ember_compute *c, ember_matrix *w, bool release_source, ember_error *err);
/* Bytes of repacked weights c holds. */
size_t ember_compute_packed_bytes(const ember_compute *c);

/* Checks that the compute's set has a product for weights of `type` (EMBER_ERR_UNSUPPORTED
 * otherwise) and preallocates the activation scratch for width n_in (the model calls it for each
 * of its matrices at load, so no forward pass allocates and no product meets a missing kernel). */
ember_status ember_compute_reserve(ember_compute *c, ember_type type, int64_t n_in, ember_error *err);
const ember_kernel_ops *ember_compute_ops(const ember_compute *c);
ember_kernels ember_compute_kernels(const ember_compute *c);
int ember_compute_threads(const ember_compute *c);

/* fn over items [0, n) on the pool in chunks of `grain` items (n <= grain: on the caller, no job):
 * for the row-wise small ops of a prefill, each row computed by the same code whichever thread
 * takes it, so the split changes no result. */
void ember_compute_for(ember_compute *c, int64_t n, int64_t grain, ember_pool_fn fn, void *arg);

/* y = x W^T, split by output rows over the pool. Activations are prepared (q8_0: quantized) once
 * per product into scratch that only grows during warm-up. Each output element is computed by the
 * same code whatever the thread count or tiling, so the result is identical for every thread
 * count. W's type must have passed ember_compute_reserve. */
void ember_matmul(ember_compute *c, const ember_matrix *w, const float *x, float *y, int64_t n_tok);
/* y[i] = x W[i]^T for i < n (n <= EMBER_MATMUL_MULTI_MAX), the matrices sharing the input x:
 * when they have one type and width, x is prepared once and the output rows of all n matrices are
 * split over the pool in ONE job (otherwise: ember_matmul on each). Every element is computed by
 * the same code as ember_matmul's, so y[i] equals ember_matmul(c, W[i], x, y[i], n_tok) bit for
 * bit. Used for Q/K/V and gate/up: fewer thread joins per decoded token. */
#define EMBER_MATMUL_MULTI_MAX 4
void ember_matmul_multi(ember_compute *c, int n, const ember_matrix *const w[], const float *x, float *const y[],
                        int64_t n_tok);

/* dx (n_tok, n_in) = g (n_tok, n_out) W with the set's transposed product (the order above), split
 * over the pool by tiles of tokens and panels of columns: each element is computed whole by one
 * thread, so the result is identical for every thread count. False when the set has none for W's
 * type (nothing is written). */
bool ember_matmul_t(ember_compute *c, const ember_matrix *w, const float *g, float *dx, int64_t n_tok);
/* The columns one item of ember_matmul_t covers (a multiple of the type's block size). */
int64_t ember_matmul_t_panel(ember_type t);

/* Causal attention of n new tokens at positions pos0..pos0+n-1 over a cache of keys and values:
 * query head h of token t reads KV head h / (n_head / n_head_kv) at positions first..p, where
 * p = pos0 + t and first = max(0, p - window + 1) when window > 0 (else 0). */
typedef struct {
    const float *q;         /* (n, n_head * hd) */
    const void *k, *v;      /* in kv_type: key/value j of KV head g at element g*kv_head_stride + j*kv_stride */
    ember_type kv_type;     /* EMBER_TYPE_F32, EMBER_TYPE_F16 or EMBER_TYPE_BF16 */
    float *out;             /* (n, n_head * hd) */
    float *scratch;         /* ember_attention_scratch_floats(threads, n_ctx, n_head, hd) floats */
    int64_t n_chunks_cap;   /* chunks of the session's context: ceil(n_ctx / EMBER_ATTN_CHUNK) */
    int64_t kv_stride;      /* elements from one position to the next within a KV head */
    int64_t kv_head_stride; /* elements from one KV head to the next */
    int64_t n_head, n_head_kv, hd, pos0, n, window;
    float scale;
    float softcap; /* > 0: scores capped to softcap * tanh(s / softcap) before the softmax (Gemma 2) */
} ember_attention_args;
/* Every row is the fold, in chunk order, of ops->attn_chunk's partials over its chunks (so the
 * result does not depend on the thread count). The work is split over the pool as (KV head, its
 * query heads, tile of tokens) items, each reading a chunk of K/V once for all its rows; a single
 * token whose KV heads are fewer than twice the threads is split by chunks instead. */
void ember_compute_attention(ember_compute *c, const ember_attention_args *a);
/* Scratch floats ember_compute_attention needs for a context of n_ctx positions. */
int64_t ember_attention_scratch_floats(int n_threads, int64_t n_ctx, int64_t n_head, int64_t hd_max);
/* The attention_pattern stage's attention in two threaded passes with the whole pattern in memory
 * between them (compute.c; a->scratch is not used). The pattern is (n_head * n, pos0 + n): row
 * h*n + t holds query t of head h over every key of the sequence. attention_probs fills it with
 * softmax(scale * q.K^T, capped as above when softcap > 0) over each query's visible keys and
 * exactly 0 elsewhere; attention_mix computes a->out = pattern x V, taking the pattern as it is
 * (no renormalisation). Both are plain scalar C shared by every kernel set (K and V read through
 * the cache's kv_type exactly), each item's arithmetic fixed, so the result is identical for every
 * set and thread count; it is not the chunked path's order, so it agrees with
 * ember_compute_attention within rounding only. */
void ember_compute_attention_probs(ember_compute *c, const ember_attention_args *a, float *pattern);
void ember_compute_attention_mix(ember_compute *c, const ember_attention_args *a, const float *pattern);

/* ---- the backward of attention (attention_backward.c): plain scalar C shared by every set ----
 * For the rows of a forward described by fwd (its q, cache, shapes, window and scale; out and
 * scratch unused) and d_out, the gradient of its output (n, n_head * hd): the probabilities are
 * recomputed row by row as attention_probs computes them (scores key by key in f32, capped when
 * fwd->softcap > 0, e = exp(s - m) in key order, p = e / sum), dp_j = d_out . v_j, D = sum_j p_j
 * dp_j and ds_j = p_j (dp_j - D), times the softcap's slope 1 - (c_j / cap)^2 when capped.
 * Then dq = scale * sum_j ds_j k_j (keys in increasing order), and for each key j of the pass's own
 * positions (pos0 .. pos0 + n - 1) dk_j = scale * sum ds q and dv_j = sum p d_out over the query
 * heads of its KV head (increasing) and the queries that see it (increasing). Every element has
 * one fixed order, so the result is identical for every thread count and set. Keys before pos0
 * are constants (no gradient). frozen: the probabilities are held at their forward values, so
 * nothing flows through the softmax (dq and dk are not written; dv is). d_pattern (or NULL):
 * (n_head * n, pos0 + n), row h*n + t, the gradient of every pattern entry, d_out . v_j for every
 * key j (masked ones too: what a pattern edited there would move). */
typedef struct {
    const ember_attention_args *fwd;
    const float *d_out; /* (n, n_head * hd) */
    float *dq;          /* (n, n_head * hd); unused when frozen */
    float *dk, *dv;     /* (n, n_head_kv * hd); dk unused when frozen */
    float *d_pattern;   /* (n_head * n, pos0 + n) or NULL */
    float *stats;       /* (n_head * n * 3) scratch: each row's max, sum and D */
    float *rows;        /* ember_attention_backward_scratch(threads, pos0 + n) floats */
    bool frozen;
} ember_attention_backward_args;
void ember_compute_attention_backward(ember_compute *c, const ember_attention_backward_args *a);
/* Floats of a->rows for n_keys keys. */
int64_t ember_attention_backward_scratch(int n_threads, int64_t n_keys);
/* Element i of a cache row of type t (EMBER_TYPE_F32, F16 or BF16) as f32, exactly. */
static inline float ember_kv_element(ember_type t, const void *row, int64_t i) {
    const uint8_t *p = row;
    uint16_t h;
    if (t == EMBER_TYPE_F32) {
        float f;
        __builtin_memcpy(&f, p + 4 * i, 4);
        return f;
    }
    __builtin_memcpy(&h, p + 2 * i, 2);
    return t == EMBER_TYPE_F16 ? ember_f16_to_f32(h) : ember_bf16_to_f32(h);
}

/* ---- the backward of the small ops (backward_ops.c): scalar C with double sums, shared by every
 * set. Each takes the forward's input as it was and the gradient of the op's output, and writes
 * the gradient of its input (never in place). frozen: the norm's scale (1 / rms, 1 / std) is held
 * at its forward value, a constant (the centring of LayerNorm stays: it is linear). */
/* y = x / rms(x) * w (w may be NULL): dx from dy. */
void ember_rmsnorm_backward(float *dx, const float *dy, const float *x, const float *w, int64_t n, float eps,
                            bool frozen);
/* y = (x - mean) / sqrt(var + eps) * w + b: dx from dy. */
void ember_layernorm_backward(float *dx, const float *dy, const float *x, const float *w, int64_t n, float eps,
                              bool frozen);
/* h = silu(g) * u: dg and du from dh. */
void ember_silu_mul_backward(float *dg, float *du, const float *dh, const float *g, const float *u, int64_t n);
/* h = gelu_tanh(g) * u (u NULL: h = gelu_tanh(g), du unused): dg and du from dh. */
void ember_gelu_mul_backward(float *dg, float *du, const float *dh, const float *g, const float *u, int64_t n);

/* ---- small ops: the reference definitions (the reference table points at these) ---- */
/* y = x / rms(x) * w (w may be NULL: no weight) */
void ember_rmsnorm(float *y, const float *x, const float *w, int64_t n, float eps);
/* y = (x - mean) / sqrt(var + eps) * w + b */
void ember_layernorm(float *y, const float *x, const float *w, const float *b, int64_t n, float eps);
/* The factors the two norms multiply by, 1 / sqrt(mean(x^2) + eps) and 1 / sqrt(var(x) + eps) (and
 * the mean), computed as the reference norms above compute them. */
float ember_rmsnorm_scale(const float *x, int64_t n, float eps);
float ember_layernorm_scale(const float *x, int64_t n, float eps, float *mean);
/* Rotates one head of head_dim values at position pos. n_rot: rotated dims (<= head_dim).
 * neox: pairs (i, i + n_rot/2); else adjacent pairs (2i, 2i+1). freq_factors (n_rot/2) may be NULL. */
void ember_rope(float *x, int64_t n_rot, int64_t pos, float base, bool neox, const float *freq_factors);
void ember_softmax(float *x, int64_t n);
float ember_silu(float x);
float ember_gelu_tanh(float x);

#endif
