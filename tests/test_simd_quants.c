/* test_simd_quants.c — the SIMD products of the 4- to 6-bit weight types (Q4_0, Q4_1, Q5_0, Q5_1,
 * Q4_K, Q5_K, Q6_K): bit for bit against a scalar transcription of the documented order of
 * operations (docs/kernels.md) over the oracle's activation quantization, within a per-type NMSE
 * budget of the exact f32 product, identical across 1/2/3 threads, ember_matmul_multi and the two
 * sets. The weights' bits are decoded here from the block layouts, independently of the kernels. */
#include "kernels.h"
#include "quants.h"
#include "test_matmul.h"
#include "test_rng.h"
#include "test_support.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- NMSE budgets against the exact f32 product of the dequantized weights and f32 activations.
 * The error is the activation rounding (8 bits per block of 32 or 256: Q8_K's single scale per 256
 * values rounds coarser than Q8_0's per 32), plus f32 rounding of the block terms. Measured on
 * Gaussian activations and quantizer-made weights (this machine): see the printed worst values. */
#define NMSE_Q8_0_ACT 1e-4   /* Q4_0, Q5_0 (Q8_0 activations); Q8_0 itself measures ~3e-5 */
#define NMSE_Q8_1_ACT 1e-4   /* Q4_1, Q5_1 */
#define NMSE_Q8_K_ACT 1.5e-4 /* Q4_K, Q5_K, Q6_K */

static ember_test_rng rng = {0x2545f4914f6cdd1dull};
static uint64_t next_u64(void) { return ember_test_rng_u64(&rng); }
static float uniform(void) { return ember_test_rng_uniform(&rng); }
static float gaussian(void) { return ember_test_rng_gaussian(&rng, 6, 0.7f); }

typedef struct {
    ember_type type;
    void (*quantize)(const float *, void *, int64_t);
    double budget;
} qtype;

static const qtype types[] = {
    {EMBER_TYPE_Q4_K, ember_quantize_row_q4_k, NMSE_Q8_K_ACT},
    {EMBER_TYPE_Q6_K, ember_quantize_row_q6_k, NMSE_Q8_K_ACT},
    {EMBER_TYPE_Q4_0, ember_quantize_row_q4_0, NMSE_Q8_0_ACT},
    {EMBER_TYPE_Q5_K, ember_quantize_row_q5_k, NMSE_Q8_K_ACT},
    {EMBER_TYPE_Q5_0, ember_quantize_row_q5_0, NMSE_Q8_0_ACT},
    {EMBER_TYPE_Q5_1, ember_quantize_row_q5_1, NMSE_Q8_1_ACT},
    {EMBER_TYPE_Q4_1, ember_quantize_row_q4_1, NMSE_Q8_1_ACT},
};
#define N_TYPES (sizeof types / sizeof types[0])

static bool is_k(ember_type t) { return t == EMBER_TYPE_Q4_K || t == EMBER_TYPE_Q5_K || t == EMBER_TYPE_Q6_K; }
static int64_t block_of(ember_type t) { return is_k(t) ? 256 : 32; }
static const char *tname(ember_type t) { return ember_type_name((uint32_t)t); }

/* A matrix of `type`: quantizer-made rows of Gaussian data with outliers (real=true), or random
 * bytes with sane f16 scales (every quant and sub-block scale value, including the extremes). */
static ember_matrix make_matrix(const qtype *q, int64_t n_out, int64_t n_in, bool real, void **buf) {
    ember_matrix m = {.type = q->type, .n_in = n_in, .n_out = n_out, .row_bytes = ember_type_row_size(q->type, n_in)};
    uint8_t *p = malloc(m.row_bytes * (size_t)n_out + 64);
    float *row = malloc(sizeof(float) * (size_t)n_in);
    const size_t bb = ember_type_traits_get(q->type)->block_bytes;
    for (int64_t o = 0; o < n_out; o++) {
        uint8_t *r = p + (size_t)o * m.row_bytes;
        if (real) {
            for (int64_t i = 0; i < n_in; i++) row[i] = gaussian() * (next_u64() % 97 == 0 ? 8.0f : 1.0f);
            q->quantize(row, r, n_in);
            continue;
        }
        for (size_t i = 0; i < m.row_bytes; i++) r[i] = (uint8_t)next_u64();
        for (int64_t b = 0; b < n_in / block_of(q->type); b++) { /* f16 scales in [0.001, 0.05) */
            uint8_t *blk = r + (size_t)b * bb;
            const uint16_t d = ember_f32_to_f16(0.001f + 0.049f * (uniform() + 1.0f) / 2.0f);
            const uint16_t d2 = ember_f32_to_f16(0.001f + 0.049f * (uniform() + 1.0f) / 2.0f);
            if (q->type == EMBER_TYPE_Q6_K) memcpy(blk + 208, &d, 2);
            else {
                memcpy(blk, &d, 2);
                if (q->type != EMBER_TYPE_Q4_0 && q->type != EMBER_TYPE_Q5_0) memcpy(blk + 2, &d2, 2);
            }
        }
    }
    free(row);
    *buf = p;
    m.data = p;
    return m;
}

static float *random_vec(int64_t n) {
    float *x = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    for (int64_t i = 0; i < n; i++) x[i] = gaussian();
    return x;
}

static bool same_bits(const float *a, const float *b, int64_t n) {
    return memcmp(a, b, sizeof(float) * (size_t)n) == 0;
}

/* ---- the weights' integers, decoded from the layouts (quants.h / quants_dequant.c) ----
 * For a K-quant super-block: q[256] (Q6_K: minus 32), the sub-block scale and minimum of each
 * value (sc[i], mn[i]); for a 32-block: q[32] minus its offset (8 / 16 for Q4_0 / Q5_0). */
static void k4_scale_min(const uint8_t *s, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

static void decode_k(ember_type t, const uint8_t *blk, int q[256], int sc[256], int mn[256]) {
    if (t == EMBER_TYPE_Q6_K) {
        const uint8_t *ql = blk, *qh = blk + 128;
        const int8_t *scales = (const int8_t *)(blk + 192);
        for (int i = 0; i < 256; i++) {
            const int n = i / 128, k = (i % 128) / 32, l = i % 32;
            const int lo = k % 2 == 0 ? ql[64 * n + l] : ql[64 * n + 32 + l];
            const int nib = k < 2 ? lo & 0xF : lo >> 4;
            const int hi = (qh[32 * n + l] >> (2 * k)) & 3;
            q[i] = (nib | hi << 4) - 32;
            sc[i] = scales[i / 16];
            mn[i] = 0;
        }
        return;
    }
    const bool five = t == EMBER_TYPE_Q5_K;
    const uint8_t *scales = blk + 4, *qh = blk + 16, *qs = blk + (five ? 48 : 16);
    for (int i = 0; i < 256; i++) {
        const int c = i / 64, l = i % 32, upper = (i % 64) >= 32, j = 2 * c + upper;
        int v = upper ? qs[32 * c + l] >> 4 : qs[32 * c + l] & 0xF;
        if (five) v |= ((qh[l] >> j) & 1) << 4;
        q[i] = v;
        k4_scale_min(scales, j, &sc[i], &mn[i]);
    }
}

static void decode_32(ember_type t, const uint8_t *blk, int q[32]) {
    const bool five = t == EMBER_TYPE_Q5_0 || t == EMBER_TYPE_Q5_1,
               has_m = t == EMBER_TYPE_Q4_1 || t == EMBER_TYPE_Q5_1;
    const uint8_t *qs = blk + (has_m ? 4 : 2) + (five ? 4 : 0);
    uint32_t qh = 0;
    if (five) memcpy(&qh, blk + (has_m ? 4 : 2), 4);
    for (int j = 0; j < 32; j++) {
        int v = j < 16 ? qs[j] & 0xF : qs[j - 16] >> 4;
        if (five) v |= (int)((qh >> j) & 1) << 4;
        q[j] = v - (t == EMBER_TYPE_Q4_0 ? 8 : t == EMBER_TYPE_Q5_0 ? 16 : 0);
    }
}

/* ---- the documented order of operations, in scalar C, from the oracle's activation blocks ---- */
static float documented_order(ember_type t, const uint8_t *row, const void *xq, int64_t n_in) {
    const size_t bb = ember_type_traits_get(t)->block_bytes;
    if (is_k(t)) {
        const ember_block_q8_K *y = xq;
        float p = 0.0f, m = 0.0f;
        for (int64_t b = 0; b < n_in / 256; b++) {
            const uint8_t *blk = row + (size_t)b * bb;
            int q[256], sc[256], mn[256];
            decode_k(t, blk, q, sc, mn);
            int32_t A = 0, B = 0;
            for (int i = 0; i < 256; i++) {
                A += sc[i] * q[i] * y[b].qs[i];
                B += mn[i] * y[b].qs[i];
            }
            uint16_t d, dmin;
            memcpy(&d, blk + (t == EMBER_TYPE_Q6_K ? 208 : 0), 2);
            memcpy(&dmin, blk + 2, 2);
            p = fmaf((float)A, ember_f16_to_f32(d) * y[b].d, p);
            if (t != EMBER_TYPE_Q6_K) m = fmaf((float)B, ember_f16_to_f32(dmin) * y[b].d, m);
        }
        return p - m;
    }
    const bool has_m = t == EMBER_TYPE_Q4_1 || t == EMBER_TYPE_Q5_1;
    float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t b = 0; b < n_in / 32; b++) {
        const uint8_t *blk = row + (size_t)b * bb;
        int q[32];
        decode_32(t, blk, q);
        const int8_t *yq = has_m ? ((const ember_block_q8_1 *)xq)[b].qs : ((const ember_block_q8_0 *)xq)[b].qs;
        const uint16_t yd = has_m ? ((const ember_block_q8_1 *)xq)[b].d : ((const ember_block_q8_0 *)xq)[b].d;
        int32_t isum = 0;
        for (int j = 0; j < 32; j++) isum += q[j] * yq[j];
        uint16_t d, mw;
        memcpy(&d, blk, 2);
        memcpy(&mw, blk + 2, 2);
        p[b % 4] = fmaf((float)isum, ember_f16_to_f32(d) * ember_f16_to_f32(yd), p[b % 4]);
        if (has_m)
            p[b % 4] = fmaf(ember_f16_to_f32(mw), ember_f16_to_f32(((const ember_block_q8_1 *)xq)[b].s), p[b % 4]);
    }
    return (p[0] + p[1]) + (p[2] + p[3]);
}

/* The oracle's activation blocks of one token (the type's traits: vec_dot_type + from_float). */
static void *quantize_act(ember_type t, const float *x, int64_t n_in) {
    const ember_type_traits *tr = ember_type_traits_get(t), *vt = ember_type_traits_get(tr->vec_dot_type);
    void *xq = malloc(vt->block_bytes * (size_t)(n_in / vt->block_size));
    tr->from_float(x, xq, n_in);
    return xq;
}

static const int64_t k_blocks[] = {1, 2, 3, 5, 8, 9, 12};
static const int64_t b32_blocks[] = {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 33, 96};
static const int64_t outs[] = {1, 2, 3, 5, 7, 9};
static const int64_t toks[] = {1, 2, 3, 4, 5, 7, 9};

/* Every output, weights read in place and repacked at load, against the documented order (bit for
 * bit) and the exact product (NMSE). */
static void test_type(ember_kernels k, const qtype *q) {
    ember_compute *c = test_compute_new(k, 2);
    if (!c) return;
    ember_error err;
    CHECK(ember_compute_reserve(c, q->type, 256 * 12, &err) == EMBER_OK);
    const bool kq = is_k(q->type);
    const int64_t *nbs = kq ? k_blocks : b32_blocks;
    const size_t n_nbs = kq ? sizeof k_blocks / sizeof k_blocks[0] : sizeof b32_blocks / sizeof b32_blocks[0];
    int bad = 0, total = 0;
    double worst = 0, num_all = 0, den_all = 0;
    for (size_t bi = 0; bi < n_nbs; bi++) {
        const int64_t n_in = nbs[bi] * block_of(q->type);
        double num = 0, den = 0;
        for (size_t oi = 0; oi < sizeof outs / sizeof outs[0]; oi++)
            for (size_t ti = 0; ti < sizeof toks / sizeof toks[0]; ti++)
                for (int real = 0; real < 2; real++) {
                    const int64_t n_out = outs[oi], n_tok = toks[ti];
                    void *buf;
                    ember_matrix w = make_matrix(q, n_out, n_in, real, &buf);
                    float *x = random_vec(n_tok * n_in), *y = malloc(sizeof(float) * (size_t)(n_tok * n_out));
                    float *wf = malloc(sizeof(float) * (size_t)n_in);
                    float *yp = malloc(sizeof(float) * (size_t)(n_tok * n_out));
                    ember_matmul(c, &w, x, y, n_tok);
                    /* the same weights repacked at load (Q4_0/Q4_K/Q6_K: the 4-row groups) */
                    ember_matrix wp = w;
                    CHECK(ember_compute_pack(c, &wp, false, &err) == EMBER_OK && wp.packed != NULL);
                    ember_matmul(c, &wp, x, yp, n_tok);
                    for (int64_t t = 0; t < n_tok; t++) {
                        void *xq = quantize_act(q->type, x + t * n_in, n_in);
                        for (int64_t o = 0; o < n_out; o++) {
                            const uint8_t *row = (const uint8_t *)w.data + (size_t)o * w.row_bytes;
                            const float want = documented_order(q->type, row, xq, n_in), got = y[t * n_out + o];
                            total += 2;
                            bad += !same_bits(&want, &got, 1) + !same_bits(&want, &yp[t * n_out + o], 1);
                            if (real) { /* the exact product, in double */
                                ember_type_traits_get(q->type)->to_float(row, wf, n_in);
                                double e = 0;
                                for (int64_t i = 0; i < n_in; i++) e += (double)wf[i] * x[t * n_in + i];
                                num += (got - e) * (got - e);
                                den += e * e;
                            }
                        }
                        free(xq);
                    }
                    free(wf);
                    free(yp);
                    free(x);
                    free(y);
                    free(buf);
                }
        const double nmse = num / den;
        if (nmse > worst) worst = nmse;
        num_all += num;
        den_all += den;
        CHECK_MSG(nmse <= q->budget, "%s %s vs the exact f32 product, n_in %lld: nmse %.3g > %.0e",
                  ember_kernels_name(k), tname(q->type), (long long)n_in, nmse, q->budget);
    }
    CHECK_MSG(bad == 0, "%s %s: %d of %d outputs differ from the documented order", ember_kernels_name(k),
              tname(q->type), bad, total);
    printf("  %-7s %-4s: %d outputs bit-identical to the documented order; nmse vs exact f32 worst %.2e (pooled %.2e, "
           "budget %.0e)\n",
           ember_kernels_name(k), tname(q->type), total - bad, worst, num_all / den_all, q->budget);
    ember_compute_free(c);
}

/* 1/2/3 threads, the single-threaded entry, packed weights and ember_matmul_multi give the same
 * bits. */
static void test_threads_and_multi(ember_kernels k, const qtype *q) {
    ember_compute *c[3];
    for (int i = 0; i < 3; i++)
        if (!(c[i] = test_compute_new(k, i + 1))) return;
    static const int64_t shapes[][3] = {{8, 61, 1}, {3, 131, 7}, {12, 77, 52}, {4, 33, 70}, {1, 1, 3}};
    int bad = 0, total = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t n_in = shapes[si][0] * block_of(q->type), n_out = shapes[si][1], n_tok = shapes[si][2];
        void *buf[2];
        ember_matrix w = make_matrix(q, n_out, n_in, true, &buf[0]), w2 = make_matrix(q, 17, n_in, false, &buf[1]);
        float *x = random_vec(n_tok * n_in), *single = malloc(sizeof(float) * (size_t)(n_tok * n_out));
        float *y[3], *y2 = malloc(sizeof(float) * (size_t)(n_tok * 17)), *ym[2];
        test_matmul(ember_compute_ops(c[0]), &w, x, single, n_tok);
        for (int i = 0; i < 3; i++) {
            y[i] = malloc(sizeof(float) * (size_t)(n_tok * n_out));
            ember_matmul(c[i], &w, x, y[i], n_tok);
            total++;
            bad += !same_bits(y[i], single, n_tok * n_out);
        }
        { /* weights copied at load (ember_compute_pack) give the same bits as read in place */
            ember_matrix wp = w;
            ember_error err;
            CHECK(ember_compute_pack(c[1], &wp, false, &err) == EMBER_OK && wp.packed != NULL);
            float *yp = malloc(sizeof(float) * (size_t)(n_tok * n_out));
            ember_matmul(c[1], &wp, x, yp, n_tok);
            total++;
            bad += !same_bits(yp, single, n_tok * n_out);
            free(yp);
        }
        ember_matmul(c[1], &w2, x, y2, n_tok);
        ym[0] = malloc(sizeof(float) * (size_t)(n_tok * n_out));
        ym[1] = malloc(sizeof(float) * (size_t)(n_tok * 17));
        const ember_matrix *const ws[] = {&w, &w2};
        for (int i = 2; i >= 1; i--) {
            ember_matmul_multi(c[i], 2, ws, x, ym, n_tok);
            total += 2;
            bad += !same_bits(ym[0], single, n_tok * n_out) + !same_bits(ym[1], y2, n_tok * 17);
        }
        for (int i = 0; i < 3; i++) free(y[i]);
        free(ym[0]);
        free(ym[1]);
        free(y2);
        free(single);
        free(x);
        free(buf[0]);
        free(buf[1]);
    }
    CHECK_MSG(bad == 0, "%s %s: threads / single / packed / multi products differ in %d of %d cases",
              ember_kernels_name(k), tname(q->type), bad, total);
    for (int i = 0; i < 3; i++) ember_compute_free(c[i]);
}

/* A NaN or an infinity in a token's activations makes that token's outputs NaN (not finite noise). */
static void test_nonfinite(ember_kernels k, const qtype *q) {
    ember_compute *c = test_compute_new(k, 1);
    if (!c) return;
    const int64_t n_in = 2 * block_of(q->type), n_out = 5, n_tok = 3;
    void *buf;
    ember_matrix w = make_matrix(q, n_out, n_in, true, &buf);
    float *x = random_vec(n_tok * n_in), y[15];
    x[1 * n_in + 3] = NAN;
    x[2 * n_in + n_in - 1] = INFINITY;
    ember_matmul(c, &w, x, y, n_tok);
    int bad = 0;
    for (int64_t o = 0; o < n_out; o++) bad += !isfinite(y[o]) + !isnan(y[n_out + o]) + !isnan(y[2 * n_out + o]);
    CHECK_MSG(bad == 0, "%s %s: non-finite activations: %d outputs wrong", ember_kernels_name(k), tname(q->type), bad);
    free(x);
    free(buf);
    ember_compute_free(c);
}

/* The Q8_K blocks a set's K-quant act_prepare stores after its reordered copy are the oracle's
 * (ember_quantize_act_q8_k) byte for byte, on blocks that reach the quantizer's edge cases: the
 * largest magnitude twice with both signs (the first one sets the sign of d), all zeros, -0,
 * subnormals, exact halves after scaling, a single non-zero value, NaN and infinities. */
static void test_q8k_prepare(ember_kernels k, ember_type type) {
    const ember_type_kernels *mm = ember_kernels_mm(ember_kernels_table(k), type);
    enum { NB = 12, N = NB * 256 };
    float *x = random_vec(N);
    for (int i = 0; i < 256; i++) x[256 + i] = 0.0f;                           /* block 1: zeros */
    for (int i = 0; i < 256; i++) x[512 + i] = i % 2 ? -0.0f : 0.0f;           /* block 2: signed zeros */
    x[768 + 7] = -3.0f, x[768 + 200] = 3.0f;                                   /* block 3: -max first */
    x[1024 + 7] = 3.0f, x[1024 + 200] = -3.0f;                                 /* block 4: +max first */
    for (int i = 0; i < 256; i++) x[1280 + i] = (float)(i - 127) * 0x1p-140f;  /* block 5: subnormals */
    for (int i = 0; i < 256; i++) x[1536 + i] = (float)(i % 255 - 127) * 0.5f; /* block 6: halves */
    for (int i = 0; i < 256; i++) x[1792 + i] = 0.0f;
    x[1792 + 255] = -1e-3f;                    /* block 7: one value */
    x[2048 + 17] = NAN;                        /* block 8: NaN */
    x[2304] = INFINITY;                        /* block 9: +inf first */
    x[2560 + 100] = -INFINITY;                 /* block 10: -inf */
    x[2816 + 3] = 1e30f, x[2816 + 4] = -1e30f; /* block 11: huge */
    const size_t size = mm->act_size(N), q8k = size - NB * sizeof(ember_block_q8_K);
    uint8_t *xa = malloc(size), *ref = malloc(NB * sizeof(ember_block_q8_K));
    memset(xa, 0xA5, size);
    mm->act_prepare(x, xa, N);
    ember_quantize_act_q8_k(x, ref, N);
    int bad = 0;
    for (int b = 0; b < NB; b++)
        bad += memcmp(xa + q8k + b * sizeof(ember_block_q8_K), ref + b * sizeof(ember_block_q8_K),
                      sizeof(ember_block_q8_K)) != 0;
    CHECK_MSG(bad == 0, "%s %s: %d of %d prepared Q8_K blocks differ from the oracle's", ember_kernels_name(k),
              tname(type), bad, NB);
    free(x);
    free(xa);
    free(ref);
}

static void test_cross_isa(const qtype *q) {
    int bad = 0, total = 0;
    const int64_t *nbs = is_k(q->type) ? k_blocks : b32_blocks;
    const size_t n_nbs =
        is_k(q->type) ? sizeof k_blocks / sizeof k_blocks[0] : sizeof b32_blocks / sizeof b32_blocks[0];
    for (size_t bi = 0; bi < n_nbs; bi++)
        for (int64_t n_tok = 1; n_tok <= 6; n_tok += 5) {
            const int64_t n_in = nbs[bi] * block_of(q->type), n_out = 9;
            void *buf;
            ember_matrix w = make_matrix(q, n_out, n_in, bi % 2 == 0, &buf);
            float *x = random_vec(n_tok * n_in), ya[54], yb[54];
            test_matmul(&ember_kernels_avx2, &w, x, ya, n_tok);
            test_matmul(&ember_kernels_avx512, &w, x, yb, n_tok);
            total++;
            bad += !same_bits(ya, yb, n_tok * n_out);
            { /* repacked weights (both sets share the layout) */
                const ember_type_kernels *mm = ember_kernels_mm(&ember_kernels_avx2, q->type);
                ember_matrix wp = w;
                void *pk = malloc(mm->pack_size(&w));
                mm->pack(&w, pk);
                wp.packed = pk;
                test_matmul(&ember_kernels_avx2, &wp, x, ya, n_tok);
                test_matmul(&ember_kernels_avx512, &wp, x, yb, n_tok);
                total++;
                bad += !same_bits(ya, yb, n_tok * n_out);
                free(pk);
            }
            free(x);
            free(buf);
        }
    CHECK_MSG(bad == 0, "%s: avx2 and avx512 differ in %d of %d products", tname(q->type), bad, total);
}

int main(void) {
    const ember_kernels sets[] = {EMBER_KERNELS_AVX2, EMBER_KERNELS_AVX512};
    int ran = 0;
    for (int s = 0; s < 2; s++) {
        if (!ember_kernels_supported(sets[s])) {
            printf("  %s: not supported by this CPU, skipped\n", ember_kernels_name(sets[s]));
            continue;
        }
        ran++;
        for (size_t t = 0; t < N_TYPES; t++) {
            CHECK_MSG(ember_kernels_mm(ember_kernels_table(sets[s]), types[t].type)->rows != ember_rows_reference,
                      "%s %s still runs the reference product", ember_kernels_name(sets[s]), tname(types[t].type));
            test_type(sets[s], &types[t]);
            test_threads_and_multi(sets[s], &types[t]);
            test_nonfinite(sets[s], &types[t]);
            if (is_k(types[t].type)) test_q8k_prepare(sets[s], types[t].type);
        }
    }
    if (ran == 0) return ember_test_skip("this CPU runs neither the avx2 nor the avx512 kernels");
    if (ran == 2) {
        for (size_t t = 0; t < N_TYPES; t++) test_cross_isa(&types[t]);
        printf("  avx2 = avx512 bit for bit for every type\n");
    }
    return ember_test_finish();
}
