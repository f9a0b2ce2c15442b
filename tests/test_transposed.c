/* test_transposed.c — the transposed product dx = g W of the backward pass, for every weight type:
 * every set bit for bit against a transcription of kernels.h's order written here (chunks of
 * EMBER_MATMUL_T_CHUNK rows, product then add), on sizes that hit every tail of tokens, rows and
 * columns; within a rounding bound of the same sum in double; and ember_matmul_t identical on 1, 2
 * and 3 threads. The weights come from the project's quantizers over Gaussian rows. */
#include "kernels.h"
#include "quants.h"
#include "test_matmul.h"
#include "test_rng.h"
#include "test_support.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static ember_test_rng rng = {0x51ed270b7f1a3c5dull};
static float gaussian(void) { return ember_test_rng_gaussian(&rng, 6, 0.7f); }

typedef struct {
    ember_type type;
    void (*quantize)(const float *, void *, int64_t); /* NULL: f32, f16, bf16 (converted here) */
} ttype;

static void q8_0(const float *x, void *y, int64_t n) { ember_quantize_row_q8_0(x, y, n); }

static const ttype types[] = {
    {EMBER_TYPE_F32, NULL},
    {EMBER_TYPE_F16, NULL},
    {EMBER_TYPE_BF16, NULL},
    {EMBER_TYPE_Q8_0, q8_0},
    {EMBER_TYPE_Q4_0, ember_quantize_row_q4_0},
    {EMBER_TYPE_Q4_1, ember_quantize_row_q4_1},
    {EMBER_TYPE_Q5_0, ember_quantize_row_q5_0},
    {EMBER_TYPE_Q5_1, ember_quantize_row_q5_1},
    {EMBER_TYPE_Q2_K, ember_quantize_row_q2_k},
    {EMBER_TYPE_Q3_K, ember_quantize_row_q3_k},
    {EMBER_TYPE_Q4_K, ember_quantize_row_q4_k},
    {EMBER_TYPE_Q5_K, ember_quantize_row_q5_k},
    {EMBER_TYPE_Q6_K, ember_quantize_row_q6_k},
};
#define N_TYPES (sizeof types / sizeof types[0])

static const char *tname(ember_type t) { return ember_type_name((uint32_t)t); }

static ember_matrix make_matrix(const ttype *q, int64_t n_out, int64_t n_in, void **buf) {
    ember_matrix m = {.type = q->type, .n_in = n_in, .n_out = n_out, .row_bytes = ember_type_row_size(q->type, n_in)};
    uint8_t *p = malloc(m.row_bytes * (size_t)n_out + 64);
    float *row = malloc(sizeof(float) * (size_t)n_in);
    for (int64_t o = 0; o < n_out; o++) {
        uint8_t *r = p + (size_t)o * m.row_bytes;
        for (int64_t i = 0; i < n_in; i++) row[i] = gaussian() * (i % 37 == 5 ? 6.0f : 1.0f);
        if (q->quantize) q->quantize(row, r, n_in);
        else
            for (int64_t i = 0; i < n_in; i++) {
                const uint16_t h = q->type == EMBER_TYPE_F16 ? ember_f32_to_f16(row[i]) : ember_f32_to_bf16(row[i]);
                if (q->type == EMBER_TYPE_F32) memcpy(r + 4 * i, &row[i], 4);
                else memcpy(r + 2 * i, &h, 2);
            }
    }
    free(row);
    *buf = p;
    m.data = p;
    return m;
}

/* The order of kernels.h, written out: per chunk a partial from +0, product then add; the partials
 * folded in chunk order. The weights through the type's to_float. w_f32: (n_out, n_in) scratch. */
static void transcription(const ember_matrix *w, const float *g, float *dx, int64_t n_tok, float *w_f32) {
    const ember_type_traits *tr = ember_type_traits_get((uint32_t)w->type);
    for (int64_t o = 0; o < w->n_out; o++)
        tr->to_float((const uint8_t *)w->data + (size_t)o * w->row_bytes, w_f32 + o * w->n_in, w->n_in);
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t i = 0; i < w->n_in; i++) {
            float total = 0.0f;
            for (int64_t o0 = 0; o0 < w->n_out; o0 += EMBER_MATMUL_T_CHUNK) {
                volatile float s = 0.0f; /* one rounding per product and per add */
                for (int64_t o = o0; o < w->n_out && o < o0 + EMBER_MATMUL_T_CHUNK; o++) {
                    volatile float prod = g[t * w->n_out + o] * w_f32[o * w->n_in + i];
                    s = s + prod;
                }
                total = o0 == 0 ? s : total + s;
            }
            dx[t * w->n_in + i] = total;
        }
}

/* Block b of row o of a Q8_0 matrix. */
static ember_block_q8_0 q8_block(const ember_matrix *w, int64_t o, int64_t b) {
    ember_block_q8_0 blk;
    memcpy(&blk, (const uint8_t *)w->data + (size_t)o * w->row_bytes + (size_t)b * sizeof blk, sizeof blk);
    return blk;
}

/* The fast Q8_0 order of kernels.h (the SIMD sets), written out: per token, block b of 32 columns
 * and chunk of rows, h = g * d (the row's block scale), s = amax / 127, hq = rint(h * 127 / amax),
 * the exact integer sum of hq * q, then s * sum rounded and folded in chunk order. s_out (may be
 * NULL): (n_tok, n_chunks, n_blocks) the scales, for the bound below. */
static void q8_fast_transcription(const ember_matrix *w, const float *g, float *dx, int64_t n_tok, float *s_out) {
    const int64_t nb = w->n_in / EMBER_QK8_0, nc = (w->n_out + EMBER_MATMUL_T_CHUNK - 1) / EMBER_MATMUL_T_CHUNK;
    float h[EMBER_MATMUL_T_CHUNK];
    int32_t hq[EMBER_MATMUL_T_CHUNK];
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t b = 0; b < nb; b++)
            for (int64_t k = 0; k < nc; k++) {
                const int64_t o0 = k * EMBER_MATMUL_T_CHUNK;
                const int64_t nr = w->n_out - o0 < EMBER_MATMUL_T_CHUNK ? w->n_out - o0 : EMBER_MATMUL_T_CHUNK;
                uint32_t abits = 0;
                for (int64_t r = 0; r < nr; r++) {
                    h[r] = g[t * w->n_out + o0 + r] * ember_f16_to_f32(q8_block(w, o0 + r, b).d);
                    uint32_t u;
                    memcpy(&u, &h[r], 4);
                    if ((u & 0x7fffffffu) > abits) abits = u & 0x7fffffffu;
                }
                float amax, s = 0.0f, inv = 0.0f;
                memcpy(&amax, &abits, 4);
                if (!(amax <= FLT_MAX)) s = NAN;
                else if (amax >= 0x1p-120f) {
                    s = amax / 127.0f;
                    inv = 127.0f / amax;
                }
                if (s_out) s_out[(t * nc + k) * nb + b] = s;
                for (int64_t r = 0; r < nr; r++) {
                    volatile float hi = h[r] * inv;
                    hq[r] = (int32_t)nearbyintf(hi);
                }
                for (int64_t c = 0; c < EMBER_QK8_0; c++) {
                    int32_t isum = 0;
                    for (int64_t r = 0; r < nr; r++) isum += hq[r] * (int32_t)q8_block(w, o0 + r, b).qs[c];
                    volatile float part = s * (float)isum;
                    float *d = dx + t * w->n_in + b * EMBER_QK8_0 + c;
                    *d = k == 0 ? part : *d + part;
                }
            }
}

/* max |dx - exact| / bound for the fast Q8_0 order: the quantization moves each h by at most s / 2,
 * so the bound is sum over chunks of s / 2 * sum |q| (times the weight's scale folded in h) plus
 * (chunks + 3) eps of the magnitudes. <= 1 passes. */
static double q8_fast_ratio(const ember_matrix *w, const float *g, const float *dx, int64_t n_tok, const float *w_f32,
                            const float *scales) {
    const int64_t nb = w->n_in / EMBER_QK8_0, nc = (w->n_out + EMBER_MATMUL_T_CHUNK - 1) / EMBER_MATMUL_T_CHUNK;
    double worst = 0.0;
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t i = 0; i < w->n_in; i++) {
            double exact = 0.0, mag = 0.0, quant = 0.0;
            for (int64_t o = 0; o < w->n_out; o++) {
                const ember_block_q8_0 blk = q8_block(w, o, i / EMBER_QK8_0);
                const double p = (double)g[t * w->n_out + o] * (double)w_f32[o * w->n_in + i];
                const double s = scales[(t * nc + o / EMBER_MATMUL_T_CHUNK) * nb + i / EMBER_QK8_0];
                exact += p;
                mag += fabs(p);
                quant += 0.5 * s * fabs((double)blk.qs[i % EMBER_QK8_0]);
            }
            const double bound = 1.001 * quant + (double)(nc + 3) * FLT_EPSILON * (mag + quant) + 1e-30;
            const double r = fabs((double)dx[t * w->n_in + i] - exact) / bound;
            if (r > worst) worst = r;
        }
    return worst;
}

/* max |dx - exact| / bound, where exact is the double sum and bound the sum's worst rounding:
 * (rows per chunk + chunks + 1) * eps * sum |g w|. <= 1 passes. */
static double rounding_ratio(const ember_matrix *w, const float *g, const float *dx, int64_t n_tok,
                             const float *w_f32) {
    const int64_t chunks = (w->n_out + EMBER_MATMUL_T_CHUNK - 1) / EMBER_MATMUL_T_CHUNK;
    double worst = 0.0;
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t i = 0; i < w->n_in; i++) {
            double exact = 0.0, mag = 0.0;
            for (int64_t o = 0; o < w->n_out; o++) {
                const double p = (double)g[t * w->n_out + o] * (double)w_f32[o * w->n_in + i];
                exact += p;
                mag += fabs(p);
            }
            const double bound = (double)(EMBER_MATMUL_T_CHUNK + chunks + 1) * FLT_EPSILON * mag + 1e-30;
            const double r = fabs((double)dx[t * w->n_in + i] - exact) / bound;
            if (r > worst) worst = r;
        }
    return worst;
}

static const ember_kernel_ops *set_table(ember_kernels k) { return ember_kernels_table(k); }

/* One case: the matrix, random gradients, the transcription's dx and room for a set's. */
typedef struct {
    ember_matrix w;
    void *buf;
    float *g, *want, *got, *w_f32, *fast; /* fast: the fast Q8_0 order's dx (Q8_0 only) */
    size_t nx;
    int64_t n_tok;
} tcase;

static tcase case_new(const ttype *q, int64_t n_out, int64_t n_in, int64_t n_tok) {
    tcase c = {.n_tok = n_tok, .nx = (size_t)(n_tok * n_in)};
    c.w = make_matrix(q, n_out, n_in, &c.buf);
    c.g = malloc(sizeof(float) * (size_t)(n_tok * n_out));
    c.want = malloc(sizeof(float) * c.nx);
    c.got = malloc(sizeof(float) * c.nx);
    c.w_f32 = malloc(sizeof(float) * (size_t)(n_out * n_in));
    for (int64_t i = 0; i < n_tok * n_out; i++) c.g[i] = gaussian();
    transcription(&c.w, c.g, c.want, n_tok, c.w_f32);
    if (q->type == EMBER_TYPE_Q8_0) {
        const int64_t nc = (n_out + EMBER_MATMUL_T_CHUNK - 1) / EMBER_MATMUL_T_CHUNK;
        float *scales = malloc(sizeof(float) * (size_t)(n_tok * nc * (n_in / EMBER_QK8_0)));
        c.fast = malloc(sizeof(float) * c.nx);
        q8_fast_transcription(&c.w, c.g, c.fast, n_tok, scales);
        const double ratio = q8_fast_ratio(&c.w, c.g, c.fast, n_tok, c.w_f32, scales);
        CHECK_MSG(ratio <= 1.0, "q8_0 fast order %lldx%lld, %lld tokens: %.3g of its bound from the double sum",
                  (long long)n_out, (long long)n_in, (long long)n_tok, ratio);
        free(scales);
    }
    memset(c.got, 0xff, sizeof(float) * c.nx);
    return c;
}

static void case_free(tcase *c) {
    free(c->g);
    free(c->want);
    free(c->got);
    free(c->w_f32);
    free(c->fast);
    free(c->buf);
}

static const ember_kernels sets[] = {EMBER_KERNELS_REFERENCE, EMBER_KERNELS_AVX2, EMBER_KERNELS_AVX512};
#define N_SETS (sizeof sets / sizeof sets[0])

/* What set s must give: the exact order, or for Q8_0 on the SIMD sets the fast order. */
static const float *expected(const tcase *c, size_t s) { return c->fast && s > 0 ? c->fast : c->want; }

/* One (type, n_out, n_in, n_tok) case on every set this CPU runs. */
static void check_case(const ttype *q, int64_t n_out, int64_t n_in, int64_t n_tok) {
    tcase c = case_new(q, n_out, n_in, n_tok);
    const double ratio = rounding_ratio(&c.w, c.g, c.want, n_tok, c.w_f32);
    CHECK_MSG(ratio <= 1.0, "%s %lldx%lld, %lld tokens: %.3g of the rounding bound from the double sum", tname(q->type),
              (long long)n_out, (long long)n_in, (long long)n_tok, ratio);
    for (size_t s = 0; s < N_SETS; s++) {
        const ember_kernel_ops *ops = set_table(sets[s]);
        if (!ops) continue; /* a set this CPU cannot run (said once in main) */
        const ember_rows_t_fn rows_t = ember_kernels_mm_t(ops, q->type);
        CHECK_MSG(rows_t != NULL, "%s has no transposed product for %s", ops->name, tname(q->type));
        if (!rows_t) continue;
        memset(c.got, 0xff, sizeof(float) * c.nx);
        rows_t(&c.w, c.g, c.got, n_tok, 0, n_in);
        CHECK_MSG(memcmp(c.got, expected(&c, s), sizeof(float) * c.nx) == 0,
                  "%s %s %lldx%lld, %lld tokens: not the documented order", ops->name, tname(q->type), (long long)n_out,
                  (long long)n_in, (long long)n_tok);
    }
    case_free(&c);
}

/* ember_matmul_t on 1, 2 and 3 threads of each set: the transcription bit for bit. */
static void check_threads(const ttype *q, int64_t n_out, int64_t n_in, int64_t n_tok) {
    tcase c = case_new(q, n_out, n_in, n_tok);
    for (size_t s = 0; s < N_SETS; s++) {
        if (!set_table(sets[s])) continue;
        for (int threads = 1; threads <= 3; threads++) {
            ember_compute *cc = test_compute_new(sets[s], threads);
            if (!cc) continue;
            memset(c.got, 0xff, sizeof(float) * c.nx);
            CHECK(ember_matmul_t(cc, &c.w, c.g, c.got, n_tok));
            CHECK_MSG(memcmp(c.got, expected(&c, s), sizeof(float) * c.nx) == 0,
                      "%s ember_matmul_t %s %lldx%lld on %d threads", set_table(sets[s])->name, tname(q->type),
                      (long long)n_out, (long long)n_in, threads);
            ember_compute_free(cc);
        }
    }
    case_free(&c);
}

int main(void) {
    if (!set_table(EMBER_KERNELS_AVX2)) fprintf(stderr, "note: this CPU cannot run avx2: reference only\n");
    if (!set_table(EMBER_KERNELS_AVX512))
        fprintf(stderr, "note: this CPU cannot run avx512: its table (the same shared code as avx2) is not run\n");
    static const int64_t outs[] = {1, 2, 3, 5, 7, 8, 15, 16, 17, 63, 64, 65, 130};
    static const int64_t toks[] = {1, 2, 3, 4, 5, 7, 9};
    static const int64_t blocks_small[] = {1, 2, 3, 5, 7, 9};
    static const int64_t f32_ins[] = {1, 2, 3, 5, 7, 8, 15, 16, 17, 31, 33, 63, 64, 65, 129, 300};
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const ttype *q = &types[ti];
        const int64_t bs = ember_type_traits_get((uint32_t)q->type)->block_size;
        const size_t n_ins = bs == 1 ? sizeof f32_ins / sizeof f32_ins[0] : bs == 32 ? 6 : 3;
        for (size_t a = 0; a < n_ins; a++) {
            const int64_t n_in = bs == 1 ? f32_ins[a] : bs * blocks_small[a];
            for (size_t b = 0; b < sizeof outs / sizeof outs[0]; b++)
                check_case(q, outs[b], n_in, toks[(a + b) % (sizeof toks / sizeof toks[0])]);
        }
        check_case(q, 70, bs == 1 ? 33 : bs, 70);                            /* a token tile of the reference past 64 */
        check_threads(q, 150, bs == 1 ? 200 : (bs == 32 ? 24 : 2) * bs, 70); /* several panels */
    }
    return ember_test_finish();
}
