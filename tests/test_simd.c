/* test_simd.c — every SIMD kernel against the reference, on sizes that hit every tail, with a named
 * error budget per type; avx2 against avx512 bit for bit; the threaded product identical for 1, 2
 * and 3 threads. Correctness only: speed is measured by bench-engine, never here. */
#include "kernels.h"
#include "test_matmul.h"
#include "test_rng.h"
#include "test_support.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- error budgets (normalised mean squared error, sum (a-b)^2 / sum b^2) ----
 * F32 / F16 / BF16 weights: the fast sets convert weights exactly and keep f32 activations, so the
 * only difference from the reference is the order of f32 rounding (fused 16-lane sums vs one
 * running sum): ~n * eps^2. */
#define NMSE_FLOAT_MATMUL 1e-11
/* Q8_0 against the quantized oracle (ember_quantize_row_q8_0 + ember_dot_q8_0_q8_0): the integer
 * block sums are exact, only the f32 combination of the block terms differs. */
#define NMSE_Q8_SAME_QUANT 1e-12
/* Q8_0 against the f32-activation reference: activation rounding to 8 bits per block of 32
 * (about (amax/127)^2/12 per element) dominates; Gaussian data measures ~3e-5. */
#define NMSE_Q8_VS_F32 2e-4
/* rmsnorm, silu/gelu: a few ulp per element (attention: tests/test_attention.c). */
#define NMSE_SMALL_OPS 1e-11
/* max relative error of the vector exp behind silu/gelu/softmax, per element */
#define REL_EXP 1e-6
/* gelu for 2 < |x| <= 8, where the value is exp(2u)-small and u's own f32 rounding is amplified */
#define REL_GELU_TAIL 2e-5

static const int64_t tails[] = {1,  2,  3,  5,  7,   8,   15,  16,  17,  31,  32,
                                33, 63, 64, 65, 127, 128, 129, 255, 256, 257, 1000};
#define N_TAILS (sizeof tails / sizeof tails[0])

static ember_test_rng rng = {0x9e3779b97f4a7c15ull};
static uint64_t next_u64(void) { return ember_test_rng_u64(&rng); }
static float uniform(void) { return ember_test_rng_uniform(&rng); }
static float gaussian(void) { return ember_test_rng_gaussian(&rng, 4, 0.8660254f); }

/* NMSE pooled over many outputs: a single dot product of random vectors can cancel to near 0,
 * which makes a one-value NMSE meaningless, so cases of one shape are accumulated together. */
typedef struct {
    double num, den;
} pooled;
static void pool_add(pooled *p, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        p->num += d * d;
        p->den += (double)b[i] * (double)b[i];
    }
}
static double pool_nmse(const pooled *p) { return p->den > 0 ? p->num / p->den : p->num; }

static bool same_bits(const float *a, const float *b, int64_t n) {
    return memcmp(a, b, (size_t)n * sizeof(float)) == 0;
}

/* A random matrix of `type` (row_bytes from the type), owned buffer in *buf. */
static ember_matrix make_matrix(ember_type type, int64_t n_out, int64_t n_in, void **buf) {
    ember_matrix m = {.type = type, .n_in = n_in, .n_out = n_out, .row_bytes = ember_type_row_size(type, n_in)};
    uint8_t *p = malloc(m.row_bytes * (size_t)n_out + 64);
    for (int64_t o = 0; o < n_out; o++) {
        uint8_t *row = p + (size_t)o * m.row_bytes;
        if (type == EMBER_TYPE_Q8_0) {
            for (int64_t b = 0; b < n_in / 32; b++) {
                ember_block_q8_0 blk;
                blk.d = ember_f32_to_f16(0.01f + 0.02f * (uniform() + 1.0f));
                for (int j = 0; j < 32; j++) blk.qs[j] = (int8_t)(next_u64() % 256 - 128); /* -128 included */
                memcpy(row + b * sizeof blk, &blk, sizeof blk);
            }
        } else {
            for (int64_t i = 0; i < n_in; i++) {
                float v = gaussian();
                if (type == EMBER_TYPE_F32) memcpy(row + 4 * i, &v, 4);
                else {
                    uint16_t h = type == EMBER_TYPE_F16 ? ember_f32_to_f16(v) : ember_f32_to_bf16(v);
                    memcpy(row + 2 * i, &h, 2);
                }
            }
        }
    }
    *buf = p;
    m.data = p;
    return m;
}

static float *random_vec(int64_t n) {
    float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) x[i] = gaussian();
    return x;
}

/* The quantized oracle: y[t, o] = ember_dot_q8_0_q8_0(W[o], quantize(x[t])). */
static void q8_oracle(const ember_matrix *w, const float *x, float *y, int64_t n_tok) {
    const int64_t nb = w->n_in / 32;
    ember_block_q8_0 *xq = malloc((size_t)nb * sizeof *xq);
    for (int64_t t = 0; t < n_tok; t++) {
        ember_quantize_row_q8_0(x + t * w->n_in, xq, w->n_in);
        for (int64_t o = 0; o < w->n_out; o++)
            y[t * w->n_out + o] = ember_dot_q8_0_q8_0(
                (const ember_block_q8_0 *)((const uint8_t *)w->data + (size_t)o * w->row_bytes), xq, w->n_in);
    }
    free(xq);
}

static const char *type_name(ember_type t) { return ember_type_name((uint32_t)t); }

/* ---- matrix products ---- */

static void test_matmul_type(const ember_kernel_ops *ops, ember_type type) {
    static const int64_t outs[] = {1, 2, 3, 4, 5, 7, 9, 17, 33};
    static const int64_t toks[] = {1, 2, 3, 4, 5, 7, 9};
    static const int64_t q8_ins[] = {32, 64, 96, 160, 224, 256, 288, 1024, 3072};
    double worst = 0, worst_f32 = 0;
    const int64_t n_ins = type == EMBER_TYPE_Q8_0 ? (int64_t)(sizeof q8_ins / sizeof q8_ins[0]) : (int64_t)N_TAILS;
    for (int64_t ii = 0; ii < n_ins; ii++) {
        const int64_t n_in = type == EMBER_TYPE_Q8_0 ? q8_ins[ii] : tails[ii];
        pooled vs_ref = {0}, vs_oracle = {0};
        for (size_t oi = 0; oi < sizeof outs / sizeof outs[0]; oi++)
            for (size_t ti = 0; ti < sizeof toks / sizeof toks[0]; ti++) {
                const int64_t n_out = outs[oi], n_tok = toks[ti];
                if (n_in >= 1024 && (n_out > 9 || n_tok > 5)) continue; /* keep it quick */
                void *buf;
                ember_matrix w = make_matrix(type, n_out, n_in, &buf);
                float *x = random_vec(n_tok * n_in);
                float *y = calloc((size_t)(n_tok * n_out), sizeof(float));
                float *ref = calloc((size_t)(n_tok * n_out), sizeof(float));
                test_matmul(ops, &w, x, y, n_tok);
                test_matmul(&ember_kernels_reference, &w, x, ref, n_tok);
                pool_add(&vs_ref, y, ref, n_tok * n_out);
                if (type == EMBER_TYPE_Q8_0) {
                    float *oracle = calloc((size_t)(n_tok * n_out), sizeof(float));
                    q8_oracle(&w, x, oracle, n_tok);
                    pool_add(&vs_oracle, y, oracle, n_tok * n_out);
                    free(oracle);
                }
                free(buf);
                free(x);
                free(y);
                free(ref);
            }
        const double e_ref = pool_nmse(&vs_ref), e_or = pool_nmse(&vs_oracle);
        if (type == EMBER_TYPE_Q8_0) {
            if (e_or > worst) worst = e_or;
            if (e_ref > worst_f32) worst_f32 = e_ref;
            CHECK_MSG(e_or <= NMSE_Q8_SAME_QUANT, "%s q8_0 vs quantized oracle, n_in %lld: nmse %.3g", ops->name,
                      (long long)n_in, e_or);
            CHECK_MSG(e_ref <= NMSE_Q8_VS_F32, "%s q8_0 vs f32 reference, n_in %lld: nmse %.3g", ops->name,
                      (long long)n_in, e_ref);
        } else {
            if (e_ref > worst) worst = e_ref;
            CHECK_MSG(e_ref <= NMSE_FLOAT_MATMUL, "%s %s matmul, n_in %lld: nmse %.3g", ops->name, type_name(type),
                      (long long)n_in, e_ref);
        }
    }
    if (type == EMBER_TYPE_Q8_0)
        printf("  %-7s q8_0: worst nmse vs quantized oracle %.2e (budget %.0e), vs f32 reference %.2e (budget %.0e)\n",
               ops->name, worst, NMSE_Q8_SAME_QUANT, worst_f32, NMSE_Q8_VS_F32);
    else
        printf("  %-7s %-4s: worst nmse vs reference %.2e (budget %.0e)\n", ops->name, type_name(type), worst,
               NMSE_FLOAT_MATMUL);
}

/* The activation quantization itself, bit for bit: one-hot weight rows (d = 1, q = 1 at column o)
 * read back d_x * q_x[o] exactly, which must equal the oracle's block. */
static void test_q8_quantization(const ember_kernel_ops *ops) {
    const int64_t n = 256;
    ember_matrix w = {
        .type = EMBER_TYPE_Q8_0, .n_in = n, .n_out = n, .row_bytes = ember_type_row_size(EMBER_TYPE_Q8_0, n)};
    uint8_t *wd = calloc((size_t)n, w.row_bytes);
    for (int64_t o = 0; o < n; o++) {
        ember_block_q8_0 *blk = (ember_block_q8_0 *)(wd + (size_t)o * w.row_bytes) + o / 32;
        blk->d = ember_f32_to_f16(1.0f);
        blk->qs[o % 32] = 1;
    }
    w.data = wd;
    float x[256], y[256];
    ember_block_q8_0 q[8];
    int mismatches = 0;
    for (int trial = 0; trial < 200; trial++) {
        for (int64_t i = 0; i < n; i++) {
            switch (trial % 5) {
            case 0: x[i] = gaussian(); break;
            case 1: x[i] = gaussian() * 1e-6f; break;                            /* f16 scale goes subnormal */
            case 2: x[i] = (float)((int)(next_u64() % 255) - 127) * 0.5f; break; /* exact halves after scaling */
            case 3: x[i] = i % 32 == 0 ? 127.0f : (float)((int)(next_u64() % 255) - 127) + 0.5f; break; /* ties */
            default: x[i] = i % 3 == 0 ? 0.0f : -0.0f; break; /* zero blocks */
            }
        }
        test_matmul(ops, &w, x, y, 1);
        ember_quantize_row_q8_0(x, q, n);
        for (int64_t o = 0; o < n; o++) {
            float want = ember_f16_to_f32(q[o / 32].d) * (float)q[o / 32].qs[o % 32];
            if (memcmp(&want, &y[o], 4) != 0 && !(want == 0 && y[o] == 0)) mismatches++;
        }
    }
    CHECK_MSG(mismatches == 0, "%s: %d quantized activations differ from ember_quantize_row_q8_0", ops->name,
              mismatches);

    /* NaN or infinity in the activations gives a non-finite output wherever the reference does
     * (the fast path's is always NaN), never a silently finite number */
    float r[256];
    for (int64_t i = 0; i < n; i++) x[i] = gaussian();
    x[40] = NAN;
    test_matmul(ops, &w, x, y, 1);
    test_matmul(&ember_kernels_reference, &w, x, r, 1);
    int agree = 0;
    for (int64_t o = 0; o < n; o++) agree += !isfinite(y[o]) && !isfinite(r[o]);
    x[40] = 1.0f;
    x[200] = INFINITY;
    test_matmul(ops, &w, x, y, 1);
    test_matmul(&ember_kernels_reference, &w, x, r, 1);
    for (int64_t o = 0; o < n; o++) agree += !isfinite(y[o]) && !isfinite(r[o]);
    CHECK_MSG(agree == 2 * n, "%s: non-finite activations must give non-finite outputs like the reference (%d of %d)",
              ops->name, agree, (int)(2 * n));
    free(wd);
}

/* The documented Q8_0 order of operations (docs/kernels.md, q8_groups.h), written out in scalar C
 * from the oracle's quantization: four partial sums, block b adds fma(isum_b, d_w * d_x, p[b % 4]),
 * result (p0 + p1) + (p2 + p3). Every SIMD set must give exactly these bits, packed or not. */
static float q8_documented_order(const ember_block_q8_0 *w, const ember_block_q8_0 *x, int64_t nb) {
    float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t b = 0; b < nb; b++) {
        int32_t isum = 0;
        for (int i = 0; i < 32; i++) isum += (int32_t)w[b].qs[i] * (int32_t)x[b].qs[i];
        const float scale = ember_f16_to_f32(w[b].d) * ember_f16_to_f32(x[b].d);
        p[b % 4] = fmaf((float)isum, scale, p[b % 4]);
    }
    return (p[0] + p[1]) + (p[2] + p[3]);
}

static void test_q8_documented_order(ember_kernels k) {
    ember_error err;
    ember_compute *c = test_compute_new(k, 2);
    if (!c) return;
    static const int64_t nbs[] = {1, 3, 4, 5, 8, 9, 17, 33, 96};
    int bad = 0, total = 0;
    for (size_t bi = 0; bi < sizeof nbs / sizeof nbs[0]; bi++)
        for (int pack = 0; pack < 4; pack++) { /* packed or file layout; 5 tokens or 1 (decode) */
            const int64_t nb = nbs[bi], n_in = 32 * nb, n_out = 7, n_tok = pack < 2 ? 5 : 1;
            void *buf;
            ember_matrix w = make_matrix(EMBER_TYPE_Q8_0, n_out, n_in, &buf);
            if (pack % 2) CHECK(ember_compute_pack(c, &w, false, &err) == EMBER_OK && w.packed != NULL);
            float *x = random_vec(n_tok * n_in), *y = malloc((size_t)(n_tok * n_out) * sizeof(float));
            ember_block_q8_0 *xq = malloc((size_t)nb * sizeof *xq);
            ember_matmul(c, &w, x, y, n_tok);
            for (int64_t t = 0; t < n_tok; t++) {
                ember_quantize_row_q8_0(x + t * n_in, xq, n_in);
                for (int64_t o = 0; o < n_out; o++) {
                    const float want = q8_documented_order(
                        (const ember_block_q8_0 *)((const uint8_t *)w.data + (size_t)o * w.row_bytes), xq, nb);
                    total++;
                    bad += !same_bits(&want, &y[t * n_out + o], 1);
                }
            }
            free(xq);
            free(x);
            free(y);
            free(buf);
        }
    /* matmul_rows handed more tokens than its documented maximum still computes them all */
    {
        const int64_t n_in = 96, n_out = 8, n_tok = EMBER_MATMUL_MAX_TOKENS + 6;
        void *buf;
        ember_matrix w = make_matrix(EMBER_TYPE_Q8_0, n_out, n_in, &buf);
        CHECK(ember_compute_pack(c, &w, false, &err) == EMBER_OK);
        const ember_type_kernels *mm = ember_kernels_mm(ember_compute_ops(c), EMBER_TYPE_Q8_0);
        const size_t stride = mm->act_size(n_in);
        float *x = random_vec(n_tok * n_in), *ya = malloc((size_t)(n_tok * n_out) * sizeof(float)),
              *yb = malloc((size_t)(n_tok * n_out) * sizeof(float));
        uint8_t *xa = malloc(stride * (size_t)n_tok);
        for (int64_t t = 0; t < n_tok; t++) mm->act_prepare(x + t * n_in, xa + (size_t)t * stride, n_in);
        mm->rows(&w, x, xa, stride, ya, n_tok, 0, n_out);
        ember_matmul(c, &w, x, yb, n_tok);
        total++;
        bad += !same_bits(ya, yb, n_tok * n_out);
        free(xa);
        free(x);
        free(ya);
        free(yb);
        free(buf);
    }
    CHECK_MSG(bad == 0, "%s: %d of %d q8_0 outputs differ from the documented order of operations",
              ember_kernels_name(k), bad, total);
    printf("  %-7s q8_0 documented order: %d outputs bit-identical to the scalar transcription\n",
           ember_kernels_name(k), total - bad);
    ember_compute_free(c);
}

/* ---- the threaded driver: identical results for 1, 2 and 3 threads ---- */

static void test_threads_identical(ember_kernels k) {
    ember_compute *c[3];
    ember_error err;
    for (int i = 0; i < 3; i++) {
        ember_status st = ember_compute_new(k, i + 1, &c[i], &err);
        CHECK_MSG(st == EMBER_OK, "ember_compute_new(%s, %d): %.300s", ember_kernels_name(k), i + 1, err.msg);
        if (st != EMBER_OK) return;
    }
    static const ember_type types[] = {EMBER_TYPE_F32, EMBER_TYPE_F16, EMBER_TYPE_BF16, EMBER_TYPE_Q8_0};
    static const int64_t shapes[][3] = {{64, 61, 1}, {96, 131, 7}, {1024, 77, 52}, {128, 33, 130}, {32, 1, 3}};
    for (size_t ti = 0; ti < 4; ti++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const int64_t n_in = shapes[si][0], n_out = shapes[si][1], n_tok = shapes[si][2];
            void *buf;
            ember_matrix w = make_matrix(types[ti], n_out, n_in, &buf);
            float *x = random_vec(n_tok * n_in);
            float *y[3], *single = malloc((size_t)(n_tok * n_out) * sizeof(float));
            for (int i = 0; i < 3; i++) {
                y[i] = malloc((size_t)(n_tok * n_out) * sizeof(float));
                ember_matmul(c[i], &w, x, y[i], n_tok);
            }
            test_matmul(ember_compute_ops(c[0]), &w, x, single, n_tok);
            CHECK_MSG(
                same_bits(y[0], y[1], n_tok * n_out) && same_bits(y[0], y[2], n_tok * n_out) &&
                    same_bits(y[0], single, n_tok * n_out),
                "%s %s %lldx%lld x %lld tokens: 1/2/3 threads and the single-threaded entry must agree bit for bit",
                ember_kernels_name(k), type_name(types[ti]), (long long)n_out, (long long)n_in, (long long)n_tok);
            for (int i = 0; i < 3; i++) free(y[i]);
            free(single);
            free(x);
            free(buf);
        }
    for (int i = 0; i < 3; i++) ember_compute_free(c[i]);
}

/* Weights repacked at load (ember_compute_pack) must give the unpacked kernels' results bit for
 * bit: odd block counts, partial 8-block spans, row counts not a multiple of 4, 1..9 tokens. */
static void test_packed_identical(ember_kernels k) {
    ember_error err;
    ember_compute *c = test_compute_new(k, 2);
    if (!c) return;
    const ember_kernel_ops *ops = ember_compute_ops(c);
    static const int64_t nbs[] = {1, 2, 3, 15, 16, 17, 31, 32, 33, 96};
    static const int64_t outs[] = {1, 3, 4, 5, 17, 64};
    int bad = 0, total = 0, packed = 0;
    for (size_t bi = 0; bi < sizeof nbs / sizeof nbs[0]; bi++)
        for (size_t oi = 0; oi < sizeof outs / sizeof outs[0]; oi++) {
            const int64_t n_in = 32 * nbs[bi], n_out = outs[oi];
            void *buf;
            ember_matrix w = make_matrix(EMBER_TYPE_Q8_0, n_out, n_in, &buf);
            ember_matrix wp = w;
            ember_status st = ember_compute_pack(c, &wp, false, &err);
            CHECK_MSG(st == EMBER_OK, "pack: %.300s", err.msg);
            packed += wp.packed != NULL;
            for (int64_t n_tok = 1; n_tok <= 9; n_tok += 2) {
                float *x = random_vec(n_tok * n_in);
                float *ya = malloc((size_t)(n_tok * n_out) * sizeof(float)),
                      *yb = malloc((size_t)(n_tok * n_out) * sizeof(float));
                test_matmul(ops, &w, x, ya, n_tok);
                ember_matmul(c, &wp, x, yb, n_tok);
                total++;
                bad += !same_bits(ya, yb, n_tok * n_out);
                free(x);
                free(ya);
                free(yb);
            }
            free(buf);
        }
    CHECK_MSG(bad == 0, "%s: packed and unpacked q8_0 products differ in %d of %d cases", ember_kernels_name(k), bad,
              total);
    printf("  %-7s packed q8_0: %d matrices repacked, %d products bit-identical to unpacked\n", ember_kernels_name(k),
           packed, total - bad);
    ember_compute_free(c);
}

/* ember_matmul_multi must equal one ember_matmul per matrix bit for bit: every type, 1/2/3
 * threads, repacked and unpacked weights, row counts that are not multiples of the row grain, token
 * counts across the activation chunk (64), and mixed types (the fallback). */
static void test_multi_identical(ember_kernels k) {
    static const ember_type types[] = {EMBER_TYPE_F32, EMBER_TYPE_F16, EMBER_TYPE_BF16, EMBER_TYPE_Q8_0};
    static const int64_t outs[][3] = {{64, 16, 16}, {61, 7, 33}, {17, 130, 1}, {96, 96, 96}};
    static const int64_t toks[] = {1, 3, 70};
    int bad = 0, total = 0;
    for (int nt = 1; nt <= 3; nt++) {
        ember_error err;
        ember_compute *c = test_compute_new(k, nt);
        if (!c) return;
        for (size_t ti = 0; ti < 5; ti++)
            for (size_t oi = 0; oi < sizeof outs / sizeof outs[0]; oi++)
                for (int pack = 0; pack < 2; pack++) {
                    const int64_t n_in = 96;
                    void *buf[3];
                    ember_matrix w[3];
                    for (int i = 0; i < 3; i++) {
                        /* ti == 4: q8_0, f16, q8_0 (inputs prepared differently: the fallback) */
                        ember_type t = ti < 4 ? types[ti] : (i == 1 ? EMBER_TYPE_F16 : EMBER_TYPE_Q8_0);
                        w[i] = make_matrix(t, outs[oi][i], n_in, &buf[i]);
                        if (pack && ember_compute_pack(c, &w[i], false, &err) != EMBER_OK)
                            CHECK_MSG(false, "%.300s", err.msg);
                    }
                    for (size_t ki = 0; ki < sizeof toks / sizeof toks[0]; ki++) {
                        const int64_t n_tok = toks[ki];
                        float *x = random_vec(n_tok * n_in), *ya[3], *yb[3];
                        for (int i = 0; i < 3; i++) {
                            ya[i] = malloc((size_t)(n_tok * outs[oi][i]) * sizeof(float));
                            yb[i] = malloc((size_t)(n_tok * outs[oi][i]) * sizeof(float));
                            ember_matmul(c, &w[i], x, ya[i], n_tok);
                        }
                        for (int n = 1; n <= 3; n++) {
                            const ember_matrix *const ws[] = {&w[0], &w[1], &w[2]};
                            for (int i = 0; i < 3; i++)
                                memset(yb[i], 0xff, (size_t)(n_tok * outs[oi][i]) * sizeof(float));
                            ember_matmul_multi(c, n, ws, x, yb, n_tok);
                            for (int i = 0; i < n; i++) {
                                total++;
                                bad += !same_bits(ya[i], yb[i], n_tok * outs[oi][i]);
                            }
                        }
                        for (int i = 0; i < 3; i++) {
                            free(ya[i]);
                            free(yb[i]);
                        }
                        free(x);
                    }
                    for (int i = 0; i < 3; i++) free(buf[i]);
                }
        ember_compute_free(c);
    }
    CHECK_MSG(bad == 0, "%s: ember_matmul_multi differs from separate products in %d of %d outputs",
              ember_kernels_name(k), bad, total);
    printf("  %-7s multi product: %d outputs bit-identical to separate products\n", ember_kernels_name(k), total - bad);
}

/* ---- vector ops ---- */

static void test_dot(const ember_kernel_ops *ops) {
    double worst = 0;
    for (size_t i = 0; i < N_TAILS; i++) {
        const int64_t n = tails[i];
        pooled p = {0};
        for (int trial = 0; trial < 64; trial++) {
            float *a = random_vec(n), *b = random_vec(n);
            float r = ember_kernels_reference.dot_f32(a, b, n), s = ops->dot_f32(a, b, n);
            pool_add(&p, &s, &r, 1);
            free(a);
            free(b);
        }
        double e = pool_nmse(&p);
        if (e > worst) worst = e;
        CHECK_MSG(e <= NMSE_FLOAT_MATMUL, "%s dot_f32 n=%lld: nmse %.3g", ops->name, (long long)n, e);
    }
    printf("  %-7s dot_f32: worst nmse %.2e (budget %.0e)\n", ops->name, worst, NMSE_FLOAT_MATMUL);
}

static void test_small_ops(const ember_kernel_ops *ops) {
    /* pooled over every size: the reference's own gelu (0.5 x (1 + tanhf(u))) loses the relative
     * accuracy of its tiny negative tail, so a one-value NMSE there would measure the reference */
    pooled pn = {0}, ps = {0}, pg = {0};
    for (size_t i = 0; i < N_TAILS; i++) {
        const int64_t n = tails[i];
        float *x = random_vec(n), *w = random_vec(n), *u = random_vec(n);
        float *a = malloc((size_t)n * sizeof(float)), *b = malloc((size_t)n * sizeof(float));
        for (int withw = 0; withw < 2; withw++) {
            ember_kernels_reference.rmsnorm(b, x, withw ? w : NULL, n, 1e-6f);
            ops->rmsnorm(a, x, withw ? w : NULL, n, 1e-6f);
            pool_add(&pn, a, b, n);
        }
        for (int64_t k = 0; k < n; k++) x[k] *= 6.0f; /* cover the curved parts of silu/gelu */
        memcpy(a, x, (size_t)n * sizeof(float));
        memcpy(b, x, (size_t)n * sizeof(float));
        ember_kernels_reference.silu_mul(b, u, n);
        ops->silu_mul(a, u, n);
        pool_add(&ps, a, b, n);
        for (int withu = 0; withu < 2; withu++) {
            memcpy(a, x, (size_t)n * sizeof(float));
            memcpy(b, x, (size_t)n * sizeof(float));
            ember_kernels_reference.gelu_mul(b, withu ? u : NULL, n);
            ops->gelu_mul(a, withu ? u : NULL, n);
            pool_add(&pg, a, b, n);
        }
        free(x);
        free(w);
        free(u);
        free(a);
        free(b);
    }
    const double en = pool_nmse(&pn), es = pool_nmse(&ps), eg = pool_nmse(&pg);
    CHECK_MSG(en <= NMSE_SMALL_OPS, "%s rmsnorm: nmse %.3g", ops->name, en);
    CHECK_MSG(es <= NMSE_SMALL_OPS, "%s silu_mul: nmse %.3g", ops->name, es);
    CHECK_MSG(eg <= NMSE_SMALL_OPS, "%s gelu_mul: nmse %.3g", ops->name, eg);
    printf("  %-7s rmsnorm %.2e, silu_mul %.2e, gelu_mul %.2e (budget %.0e)\n", ops->name, en, es, eg, NMSE_SMALL_OPS);

    /* silu element by element against double precision: bounds the vector exp's error too */
    float worst_rel = 0;
    for (int k = -2000; k <= 2000; k++) {
        float xv = (float)k * 0.0437f, one = 1.0f, g = xv;
        ops->silu_mul(&g, &one, 1);
        float gv[16], ones[16];
        for (int j = 0; j < 16; j++) gv[j] = xv, ones[j] = 1.0f;
        ops->silu_mul(gv, ones, 16); /* the vector lanes too */
        double want = (double)xv / (1.0 + exp(-(double)xv));
        float rel = want != 0 ? (float)fabs((g - want) / want) : fabsf(g);
        float relv = want != 0 ? (float)fabs((gv[3] - want) / want) : fabsf(gv[3]);
        if (rel > worst_rel) worst_rel = rel;
        if (relv > worst_rel) worst_rel = relv;
    }
    CHECK_MSG(worst_rel <= REL_EXP, "%s silu relative error %.3g > %.0e", ops->name, worst_rel, REL_EXP);
    /* gelu element by element against double precision, tails included (|x| <= 8: below that the
     * true value is under 1e-20 and only its absolute size matters). Beyond |x| = 2 the result is
     * ever more exp(2u)-small and inherits the f32 rounding of u (|u| up to 25) amplified by 2|u|: there the
     * bound is REL_GELU_TAIL. */
    worst_rel = 0;
    float worst_tail = 0;
    for (int k = -2000; k <= 2000; k++) {
        float gv[17];
        for (int j = 0; j < 17; j++) gv[j] = (float)k * 0.004f;
        ops->gelu_mul(gv, NULL, 17); /* lanes 0-15 vector, 16 the scalar tail */
        double xd = (double)k * 0.004f;
        double ud = 0.79788456080286535588 * (xd + 0.044715 * xd * xd * xd);
        double want = xd / (1.0 + exp(-2.0 * ud)); /* = 0.5 x (1 + tanh(u)), without its cancellation */
        for (int j = 0; j < 17; j += 16) {
            float rel = want != 0 ? (float)fabs((gv[j] - want) / want) : fabsf(gv[j]);
            float *worst = fabs(xd) <= 2.0 ? &worst_rel : &worst_tail;
            if (rel > *worst) *worst = rel;
        }
    }
    CHECK_MSG(worst_rel <= REL_EXP, "%s gelu relative error %.3g > %.0e", ops->name, worst_rel, REL_EXP);
    CHECK_MSG(worst_tail <= REL_GELU_TAIL, "%s gelu tail relative error %.3g > %.0e", ops->name, worst_tail,
              REL_GELU_TAIL);
    float nan_in[17], one17[17];
    for (int j = 0; j < 17; j++) nan_in[j] = NAN, one17[j] = 1.0f;
    ops->silu_mul(nan_in, one17, 17);
    CHECK_MSG(isnan(nan_in[0]) && isnan(nan_in[16]), "%s silu(NaN) must stay NaN", ops->name);
}

static void test_rope(const ember_kernel_ops *ops) {
    static const int64_t hds[] = {2, 4, 16, 64, 128, 256};
    bool ok = true;
    float ff[128];
    for (int i = 0; i < 128; i++) ff[i] = 1.0f + (float)i * 0.25f;
    for (size_t hi = 0; hi < sizeof hds / sizeof hds[0]; hi++)
        for (int variant = 0; variant < 4; variant++) {
            const int64_t hd = hds[hi], n_rot = variant == 3 && hd >= 4 ? hd / 2 : hd, heads = 5;
            float *x = random_vec(heads * hd), *r = malloc((size_t)(heads * hd) * sizeof(float));
            memcpy(r, x, (size_t)(heads * hd) * sizeof(float));
            const bool neox = variant & 1;
            const float *f = variant == 2 && n_rot / 2 <= 128 ? ff : NULL;
            for (int64_t pos = 0; pos < 300; pos += 37) {
                ember_kernels_reference.rope_heads(r, heads, hd, n_rot, pos, 10000.0f, neox, f);
                ops->rope_heads(x, heads, hd, n_rot, pos, 10000.0f, neox, f);
            }
            ok = ok && same_bits(x, r, heads * hd);
            free(x);
            free(r);
        }
    CHECK_MSG(ok, "%s rope_heads must be bit-identical to ember_rope per head", ops->name);
}

/* ---- avx2 against avx512, bit for bit ---- */

static void test_cross_isa(void) {
    const ember_kernel_ops *a = &ember_kernels_avx2, *b = &ember_kernels_avx512;
    static const ember_type types[] = {EMBER_TYPE_F32, EMBER_TYPE_F16, EMBER_TYPE_BF16, EMBER_TYPE_Q8_0};
    int bad = 0, total = 0;
    for (size_t ti = 0; ti < 4; ti++)
        for (size_t ii = 0; ii < N_TAILS; ii++) {
            int64_t n_in = tails[ii];
            if (types[ti] == EMBER_TYPE_Q8_0) n_in = 32 * (int64_t)(ii + 1);
            for (int64_t n_tok = 1; n_tok <= 6; n_tok += 5)
                for (int64_t n_out = 1; n_out <= 9; n_out += 4) {
                    void *buf;
                    ember_matrix w = make_matrix(types[ti], n_out, n_in, &buf);
                    float *x = random_vec(n_tok * n_in);
                    float *ya = malloc((size_t)(n_tok * n_out) * sizeof(float)),
                          *yb = malloc((size_t)(n_tok * n_out) * sizeof(float));
                    test_matmul(a, &w, x, ya, n_tok);
                    test_matmul(b, &w, x, yb, n_tok);
                    total++;
                    if (!same_bits(ya, yb, n_tok * n_out)) bad++;
                    free(buf);
                    free(x);
                    free(ya);
                    free(yb);
                }
        }
    static const int64_t big[] = {1024, 3072, 8192};
    for (size_t ti = 0; ti < 4; ti++)
        for (size_t bi = 0; bi < 3; bi++)
            for (int64_t n_tok = 1; n_tok <= 5; n_tok += 4) {
                const int64_t n_in = big[bi] + (types[ti] == EMBER_TYPE_Q8_0 ? 0 : 3), n_out = 13;
                void *buf;
                ember_matrix w = make_matrix(types[ti], n_out, n_in, &buf);
                float *x = random_vec(n_tok * n_in);
                float ya[13 * 5], yb[13 * 5];
                test_matmul(a, &w, x, ya, n_tok);
                test_matmul(b, &w, x, yb, n_tok);
                total++;
                if (!same_bits(ya, yb, n_tok * n_out)) bad++;
                free(buf);
                free(x);
            }
    CHECK_MSG(bad == 0, "avx2 and avx512 matmul differ in %d of %d cases", bad, total);

    bad = 0;
    for (size_t i = 0; i < N_TAILS; i++) {
        const int64_t n = tails[i];
        float *x = random_vec(n), *w = random_vec(n), *u = random_vec(n);
        float *p = malloc((size_t)n * sizeof(float)), *q = malloc((size_t)n * sizeof(float));
        float da = a->dot_f32(x, w, n), db = b->dot_f32(x, w, n);
        bad += memcmp(&da, &db, 4) != 0;
        a->rmsnorm(p, x, w, n, 1e-5f);
        b->rmsnorm(q, x, w, n, 1e-5f);
        bad += !same_bits(p, q, n);
        for (int64_t k = 0; k < n; k++) x[k] *= 8.0f;
        memcpy(p, x, (size_t)n * 4);
        memcpy(q, x, (size_t)n * 4);
        a->silu_mul(p, u, n);
        b->silu_mul(q, u, n);
        bad += !same_bits(p, q, n);
        memcpy(p, x, (size_t)n * 4);
        memcpy(q, x, (size_t)n * 4);
        a->gelu_mul(p, u, n);
        b->gelu_mul(q, u, n);
        bad += !same_bits(p, q, n);
        free(x);
        free(w);
        free(u);
        free(p);
        free(q);
    }
    CHECK_MSG(bad == 0, "avx2 and avx512 vector ops differ in %d cases", bad);
}

/* EMBER_KERNELS overrides "auto" (and only "auto"); a name that is not a kernel set is an error. */
static void test_env_override(void) {
    ember_compute *c = NULL;
    ember_error err;
    setenv("EMBER_KERNELS", "reference", 1);
    CHECK(ember_compute_new(EMBER_KERNELS_AUTO, 1, &c, &err) == EMBER_OK &&
          ember_compute_kernels(c) == EMBER_KERNELS_REFERENCE);
    ember_compute_free(c);
    if (ember_kernels_supported(EMBER_KERNELS_AVX2)) {
        CHECK(ember_compute_new(EMBER_KERNELS_AVX2, 1, &c, &err) == EMBER_OK &&
              ember_compute_kernels(c) == EMBER_KERNELS_AVX2);
        ember_compute_free(c);
    }
    setenv("EMBER_KERNELS", "avx-512", 1);
    c = NULL;
    CHECK(ember_compute_new(EMBER_KERNELS_AUTO, 1, &c, &err) == EMBER_ERR_ARG && c == NULL &&
          strstr(err.msg, "avx-512"));
    unsetenv("EMBER_KERNELS");
    for (int k = EMBER_KERNELS_AVX2; k <= EMBER_KERNELS_AVX512; k++)
        if (!ember_kernels_supported((ember_kernels)k)) {
            CHECK(ember_compute_new((ember_kernels)k, 1, &c, &err) == EMBER_ERR_UNSUPPORTED &&
                  strstr(err.msg, "lacks"));
            printf("  unsupported request reported as: %s\n", err.msg);
        }
}

int main(void) {
    CHECK(ember_kernels_supported(EMBER_KERNELS_REFERENCE) && ember_kernels_supported(EMBER_KERNELS_AUTO));
    ember_kernels chosen;
    const ember_kernel_ops *auto_ops = ember_kernels_select(EMBER_KERNELS_AUTO, &chosen);
    CHECK(auto_ops != NULL && ember_kernels_supported(chosen));
    printf("cpu: auto resolves to %s\n", ember_kernels_name(chosen));

    const ember_kernels sets[] = {EMBER_KERNELS_AVX2, EMBER_KERNELS_AVX512};
    int tested = 0;
    for (size_t s = 0; s < 2; s++) {
        if (!ember_kernels_supported(sets[s])) {
            printf("%s: not supported on this CPU, skipped\n", ember_kernels_name(sets[s]));
            CHECK(ember_kernels_select(sets[s], &chosen) == NULL);
            continue;
        }
        const ember_kernel_ops *ops = ember_kernels_select(sets[s], &chosen);
        CHECK(ops != NULL && chosen == sets[s]);
        printf("%s:\n", ops->name);
        tested++;
        test_matmul_type(ops, EMBER_TYPE_F32);
        test_matmul_type(ops, EMBER_TYPE_F16);
        test_matmul_type(ops, EMBER_TYPE_BF16);
        test_matmul_type(ops, EMBER_TYPE_Q8_0);
        test_q8_quantization(ops);
        test_dot(ops);
        test_small_ops(ops);
        test_rope(ops);
        test_threads_identical(sets[s]);
        test_packed_identical(sets[s]);
        test_q8_documented_order(sets[s]);
        test_multi_identical(sets[s]);
    }
    test_threads_identical(EMBER_KERNELS_REFERENCE);
    test_multi_identical(EMBER_KERNELS_REFERENCE);
    test_env_override();
    if (ember_kernels_supported(EMBER_KERNELS_AVX2) && ember_kernels_supported(EMBER_KERNELS_AVX512)) test_cross_isa();
    if (!tested) return ember_test_skip("no SIMD kernel set runs on this CPU");
    return ember_test_finish();
}
