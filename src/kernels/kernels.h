/* kernels.h — the numeric operations of a forward pass, as one table per kernel set.
 * The reference set (ref.c) is the oracle: plain scalar C, f32 accumulation. Faster sets keep the
 * same signatures and are chosen at run time (dispatch.c). No model knowledge in here.
 *
 * Kernel sets:
 *   reference  ref.c     scalar C, every op as written in the model's maths
 *   avx2       avx2.c    AVX2 + FMA + F16C
 *   avx512     avx512.c  AVX-512 F/BW/VL + VNNI
 * avx2 and avx512 compute bit-identical results for every op (docs/kernels.md gives the common
 * order of operations), so "auto" agrees across machines that pick either. */
#ifndef EMBER_KERNELS_H
#define EMBER_KERNELS_H

#include "ember.h"
#include "gguf.h"
#include "threads.h"

/* A weight matrix used in place from the mapping: n_out rows of n_in values, row-major. */
typedef struct {
    ember_type type;
    const void *data;   /* (n_out, n_in) in `type` */
    int64_t n_in, n_out;
    size_t row_bytes;
    const void *packed; /* the same weights repacked by the model's kernel set, or NULL (see
                           ember_compute_pack); `data` stays valid and is what the reference reads */
} ember_matrix;

float ember_f16_to_f32(uint16_t h);
uint16_t ember_f32_to_f16(float f);   /* round to nearest even */
float ember_bf16_to_f32(uint16_t h);
uint16_t ember_f32_to_bf16(float f);  /* round to nearest even */

/* Row r of m as f32 (n_in values). */
void ember_matrix_row_f32(const ember_matrix *m, int64_t r, float *out);

/* ---- Q8_0 activation quantization (the fast path's scheme for Q8_0 weights, llama.cpp's) ----
 * Per block of 32 values: amax = max|x|, d = amax / 127 stored as f16 (round to nearest even),
 * q = round-half-even(x * (127 / amax)) in [-127, 127] (0 when amax is 0). A block holding a NaN or
 * an infinity gets d = NaN and q = 0, so the product comes out NaN instead of silently finite.
 * n must be a multiple of 32. */
void ember_quantize_row_q8_0(const float *x, ember_block_q8_0 *y, int64_t n);
/* Reference product of a Q8_0 weight row and a quantized activation row: per block the exact
 * integer sum of the 32 products, then s += (f32(d_w) * f32(d_x)) * isum in block order. */
float ember_dot_q8_0_q8_0(const ember_block_q8_0 *w, const ember_block_q8_0 *x, int64_t n);

/* The most tokens one matmul_rows call carries (ember_matmul slices longer runs). */
#define EMBER_MATMUL_MAX_TOKENS 64

typedef struct {
    const char *name;
    /* y[t, o] = sum_i W[o, i] * x[t, i] for t < n_tok: y (n_tok, n_out), x (n_tok, n_in).
     * Whole product on the calling thread (SIMD sets allocate their activation scratch here; the
     * engine uses ember_matmul instead). */
    void (*matmul)(const ember_matrix *w, const float *x, float *y, int64_t n_tok);
    float (*dot_f32)(const float *a, const float *b, int64_t n);

    /* ---- the pieces ember_matmul threads ----
     * act_size: bytes one token's activations take once prepared for weights of `type` (0: the
     * f32 rows are used as they are). act_prepare: prepares one token (n_in values). */
    size_t (*act_size)(ember_type type, int64_t n_in);
    void (*act_prepare)(ember_type type, const float *x, void *xa, int64_t n_in);
    /* Rows [o0, o1) of y for every token (n_tok <= EMBER_MATMUL_MAX_TOKENS); xa: prepared rows `xa_stride` bytes apart, or NULL.
     * Reads w->packed when set (o0 is then a multiple of 16). */
    void (*matmul_rows)(const ember_matrix *w, const float *x, const void *xa, size_t xa_stride, float *y,
                        int64_t n_tok, int64_t o0, int64_t o1);
    /* Optional repacking of a matrix into this set's layout (NULL: the set reads the file layout
     * only). pack_size: bytes needed, 0 when this type is not repacked. pack: fills dst (64-byte
     * aligned) from w->data; results must equal the unpacked path's bit for bit. The layout must be
     * one run per group of 4 rows (pack_size of 4 rows each), so groups can be packed in parallel. */
    size_t (*pack_size)(const ember_matrix *w);
    void (*pack)(const ember_matrix *w, void *dst);

    /* One query head over n_keys cached positions: out (hd) = softmax(scale * q.K^T) V, where key j
     * is k + j*kv_stride and value j is v + j*kv_stride. scores: n_keys floats of scratch. */
    void (*attn_head)(const float *q, const float *k, const float *v, int64_t kv_stride, int64_t n_keys, int64_t hd,
                      float scale, float *scores, float *out);

    /* ---- small ops (same meaning as the ember_* reference functions below) ---- */
    void (*rmsnorm)(float *y, const float *x, const float *w, int64_t n, float eps);
    /* g[i] = silu(g[i]) * u[i] */
    void (*silu_mul)(float *g, const float *u, int64_t n);
    /* g[i] = gelu_tanh(g[i]) * u[i]; u NULL: g[i] = gelu_tanh(g[i]) */
    void (*gelu_mul)(float *g, const float *u, int64_t n);
    /* RoPE on n_heads consecutive heads of hd values each (ember_rope on every head) */
    void (*rope_heads)(float *x, int64_t n_heads, int64_t hd, int64_t n_rot, int64_t pos, float base, bool neox,
                       const float *freq_factors);
} ember_kernel_ops;

extern const ember_kernel_ops ember_kernels_reference;
/* rope.c: ember_rope on every head with the angles computed once per call; bit-identical to the
 * reference (same double-precision angles, same f32 rotation), used by the SIMD sets. */
void ember_rope_heads_fast(float *x, int64_t n_heads, int64_t hd, int64_t n_rot, int64_t pos, float base, bool neox,
                           const float *freq_factors);
extern const ember_kernel_ops ember_kernels_avx2;   /* call only when ember_kernels_supported() */
extern const ember_kernel_ops ember_kernels_avx512;

/* Whether this CPU and OS can run a kernel set (auto and reference: always). */
bool ember_kernels_supported(ember_kernels k);
/* The table for a requested kernel set. AUTO (after the EMBER_KERNELS override, when set to a valid
 * name) resolves to the best supported set: avx512, else avx2, else reference. An explicit request
 * the CPU cannot run returns NULL (the caller reports it); *chosen names the set asked for then. */
const ember_kernel_ops *ember_kernels_select(ember_kernels want, ember_kernels *chosen);

/* ---- the compute context: a kernel table, a thread pool and scratch, one per model ---- */
typedef struct ember_compute ember_compute;

/* Resolves `want` as ember_kernels_select does (an unsupported explicit request is an
 * EMBER_ERR_UNSUPPORTED error naming the missing CPU features) and starts n_threads threads. */
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

/* Preallocates the activation scratch for products with weights of `type` and width n_in (the
 * model calls it for each of its matrices at load, so no forward pass allocates). */
ember_status ember_compute_reserve(ember_compute *c, ember_type type, int64_t n_in, ember_error *err);
const ember_kernel_ops *ember_compute_ops(const ember_compute *c);
ember_kernels ember_compute_kernels(const ember_compute *c);
int ember_compute_threads(const ember_compute *c);
ember_pool *ember_compute_pool(ember_compute *c);

/* y = x W^T as ops->matmul defines it, split by output rows over the pool. Activations are
 * prepared (q8_0: quantized) once per product into scratch that only grows during warm-up.
 * Each output element is computed by the same code whatever the thread count or tiling, so the
 * result is identical for every thread count. */
void ember_matmul(ember_compute *c, const ember_matrix *w, const float *x, float *y, int64_t n_tok);
/* y[i] = x W[i]^T for i < n (n <= EMBER_MATMUL_MULTI_MAX), the matrices sharing the input x:
 * when they have one type and width, x is prepared once and the output rows of all n matrices are
 * split over the pool in ONE job (otherwise: ember_matmul on each). Every element is computed by
 * the same code as ember_matmul's, so y[i] equals ember_matmul(c, W[i], x, y[i], n_tok) bit for
 * bit. Used for Q/K/V and gate/up: fewer thread joins per decoded token. */
#define EMBER_MATMUL_MULTI_MAX 4
void ember_matmul_multi(ember_compute *c, int n, const ember_matrix *const w[], const float *x, float *const y[],
                        int64_t n_tok);

/* ---- small ops: the reference definitions (the reference table points at these) ---- */
/* y = x / rms(x) * w (w may be NULL: no weight) */
void ember_rmsnorm(float *y, const float *x, const float *w, int64_t n, float eps);
/* y = (x - mean) / sqrt(var + eps) * w + b */
void ember_layernorm(float *y, const float *x, const float *w, const float *b, int64_t n, float eps);
/* Rotates one head of head_dim values at position pos. n_rot: rotated dims (<= head_dim).
 * neox: pairs (i, i + n_rot/2); else adjacent pairs (2i, 2i+1). freq_factors (n_rot/2) may be NULL. */
void ember_rope(float *x, int64_t n_rot, int64_t pos, float base, bool neox, const float *freq_factors);
void ember_softmax(float *x, int64_t n);
float ember_silu(float x);
float ember_gelu_tanh(float x);

#endif
