/* test_kernels.c — the reference kernels and the sampler against values worked out by hand:
 * half-precision bit patterns, small matrices with exact products, norms and RoPE from the formulas. */
#include "ember.h"
#include "kernels.h"
#include "test_matmul.h"
#include "test_support.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static float bits_to_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#define CHECK_BITS(expr, want)                                                                                         \
    CHECK_MSG((expr) == (want), "%s = 0x%04x, expected 0x%04x", #expr, (unsigned)(expr), (unsigned)(want))

/* ---- f16 / bf16 ------------------------------------------------------------------------------ */

static void test_f16(void) {
    /* exact values */
    CHECK_BITS(ember_f32_to_f16(1.0f), 0x3C00);
    CHECK_BITS(ember_f32_to_f16(-2.0f), 0xC000);
    CHECK_BITS(ember_f32_to_f16(0.5f), 0x3800);
    CHECK_BITS(ember_f32_to_f16(0.0f), 0x0000);
    CHECK_BITS(ember_f32_to_f16(-0.0f), 0x8000);
    CHECK_BITS(ember_f32_to_f16(65504.0f), 0x7BFF); /* largest finite */
    CHECK_BITS(ember_f32_to_f16(0x1p-14f), 0x0400); /* smallest normal */
    /* subnormals: value = m * 2^-24 */
    CHECK_BITS(ember_f32_to_f16(0x1p-24f), 0x0001);
    CHECK_BITS(ember_f32_to_f16(1023 * 0x1p-24f), 0x03FF);
    CHECK_BITS(ember_f32_to_f16(0x1p-25f), 0x0000);            /* tie between 0 and 1: even (0) */
    CHECK_BITS(ember_f32_to_f16(3 * 0x1p-25f), 0x0002);        /* tie between 1 and 2: even (2) */
    CHECK_BITS(ember_f32_to_f16(0x1p-25f + 0x1p-40f), 0x0001); /* just above the tie */
    CHECK_BITS(ember_f32_to_f16(-0x1p-26f), 0x8000);           /* underflows to -0 */
    /* ties in the normal range: the f16 ulp at 1 is 2^-10 */
    CHECK_BITS(ember_f32_to_f16(1.0f + 0x1p-11f), 0x3C00);            /* to even (down) */
    CHECK_BITS(ember_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3C02);        /* to even (up) */
    CHECK_BITS(ember_f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3C01); /* above the tie */
    CHECK_BITS(ember_f32_to_f16(2.0f - 0x1p-11f), 0x4000);            /* carry into the exponent */
    /* overflow */
    CHECK_BITS(ember_f32_to_f16(65519.0f), 0x7BFF); /* below the tie with 65536 */
    CHECK_BITS(ember_f32_to_f16(65520.0f), 0x7C00); /* the tie rounds to even: infinity */
    CHECK_BITS(ember_f32_to_f16(1e10f), 0x7C00);
    CHECK_BITS(ember_f32_to_f16(-1e10f), 0xFC00);
    CHECK_BITS(ember_f32_to_f16(INFINITY), 0x7C00);
    CHECK_BITS(ember_f32_to_f16(-INFINITY), 0xFC00);
    uint16_t n = ember_f32_to_f16(NAN);
    CHECK((n & 0x7C00) == 0x7C00 && (n & 0x03FF) != 0);
    n = ember_f32_to_f16(bits_to_f32(0x7F800001u)); /* a NaN whose payload is only in low bits */
    CHECK((n & 0x7C00) == 0x7C00 && (n & 0x03FF) != 0);

    CHECK(ember_f16_to_f32(0x3C00) == 1.0f);
    CHECK(ember_f16_to_f32(0xC000) == -2.0f);
    CHECK(ember_f16_to_f32(0x7BFF) == 65504.0f);
    CHECK(ember_f16_to_f32(0x0001) == 0x1p-24f);
    CHECK(ember_f16_to_f32(0x03FF) == 1023 * 0x1p-24f);
    CHECK(ember_f16_to_f32(0x8001) == -0x1p-24f);
    CHECK(ember_f16_to_f32(0x3555) == 0x1.554p-2f); /* 0.333251953125 */
    float nz = ember_f16_to_f32(0x8000);
    CHECK(nz == 0.0f && signbit(nz));
    CHECK(isinf(ember_f16_to_f32(0x7C00)) && ember_f16_to_f32(0x7C00) > 0);
    CHECK(isinf(ember_f16_to_f32(0xFC00)) && ember_f16_to_f32(0xFC00) < 0);
    CHECK(isnan(ember_f16_to_f32(0x7E00)));
    CHECK(isnan(ember_f16_to_f32(0x7C01)));

    /* Every non-NaN half survives f16 -> f32 -> f16 unchanged. */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        if ((h & 0x7C00) == 0x7C00 && (h & 0x3FF)) continue;
        if (ember_f32_to_f16(ember_f16_to_f32((uint16_t)h)) != h) bad++;
    }
    CHECK_MSG(bad == 0, "%d halves changed in a round trip", bad);
}

static void test_bf16(void) {
    CHECK_BITS(ember_f32_to_bf16(1.0f), 0x3F80);
    CHECK_BITS(ember_f32_to_bf16(-2.0f), 0xC000);
    CHECK_BITS(ember_f32_to_bf16(3.0f), 0x4040);
    CHECK_BITS(ember_f32_to_bf16(-0.0f), 0x8000);
    /* the bf16 ulp at 1 is 2^-7 */
    CHECK_BITS(ember_f32_to_bf16(1.0f + 0x1p-8f), 0x3F80);            /* tie: even (down) */
    CHECK_BITS(ember_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3F82);        /* tie: even (up) */
    CHECK_BITS(ember_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81); /* above the tie */
    CHECK_BITS(ember_f32_to_bf16(bits_to_f32(0x00010000u)), 0x0001);  /* f32 subnormal, exact */
    CHECK_BITS(ember_f32_to_bf16(bits_to_f32(0x7F7FFFFFu)), 0x7F80);  /* FLT_MAX rounds to inf */
    CHECK_BITS(ember_f32_to_bf16(INFINITY), 0x7F80);
    CHECK_BITS(ember_f32_to_bf16(-INFINITY), 0xFF80);
    uint16_t n = ember_f32_to_bf16(bits_to_f32(0x7F800001u)); /* must stay a NaN, not become inf */
    CHECK((n & 0x7F80) == 0x7F80 && (n & 0x7F) != 0);
    n = ember_f32_to_bf16(bits_to_f32(0xFFFFFFFFu)); /* rounding must not carry a NaN into the sign */
    CHECK((n & 0x7F80) == 0x7F80 && (n & 0x7F) != 0);

    CHECK(ember_bf16_to_f32(0x3F80) == 1.0f);
    CHECK(ember_bf16_to_f32(0x4049) == 3.140625f);
    CHECK(ember_bf16_to_f32(0x0001) == bits_to_f32(0x00010000u));
    CHECK(isinf(ember_bf16_to_f32(0xFF80)) && ember_bf16_to_f32(0xFF80) < 0);
    CHECK(isnan(ember_bf16_to_f32(0x7FC0)));

    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        if ((h & 0x7F80) == 0x7F80 && (h & 0x7F)) continue;
        if (ember_f32_to_bf16(ember_bf16_to_f32((uint16_t)h)) != h) bad++;
    }
    CHECK_MSG(bad == 0, "%d bf16 values changed in a round trip", bad);
}

/* ---- matrices -------------------------------------------------------------------------------- */

/* W = [[1,2,3],[4,5,6]] in each 16-bit type, and x = [[1,0.5,-1],[2,2,2]]:
 * W x0 = [1+1-3, 4+2.5-6] = [-1, 0.5]; W x1 = [12, 30]. */
static void check_small_matrix(const char *what, ember_type type, const void *data, size_t row_bytes) {
    ember_matrix m = {.type = type, .data = data, .n_in = 3, .n_out = 2, .row_bytes = row_bytes};
    float row[3];
    ember_kernels_reference.get_row(&m, 0, row);
    CHECK_MSG(row[0] == 1 && row[1] == 2 && row[2] == 3, "%s row 0", what);
    ember_kernels_reference.get_row(&m, 1, row);
    CHECK_MSG(row[0] == 4 && row[1] == 5 && row[2] == 6, "%s row 1", what);
    const float x[6] = {1, 0.5f, -1, 2, 2, 2};
    float y[4] = {0};
    test_matmul(&ember_kernels_reference, &m, x, y, 2);
    CHECK_MSG(y[0] == -1 && y[1] == 0.5f && y[2] == 12 && y[3] == 30, "%s: y = [%g %g %g %g]", what, y[0], y[1], y[2],
              y[3]);
}

static void test_matrices(void) {
    const float w32[6] = {1, 2, 3, 4, 5, 6};
    check_small_matrix("f32", EMBER_TYPE_F32, w32, 12);
    const uint16_t w16[6] = {0x3C00, 0x4000, 0x4200, 0x4400, 0x4500, 0x4600};
    check_small_matrix("f16", EMBER_TYPE_F16, w16, 6);
    const uint16_t wbf[6] = {0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0};
    check_small_matrix("bf16", EMBER_TYPE_BF16, wbf, 6);

    /* Q8_0, 32 columns x 2 rows: row 0 d = 0.5 (0x3800), q = j - 16; row 1 d = 1 (0x3C00), q = j. */
    ember_block_q8_0 q[2];
    q[0].d = 0x3800;
    q[1].d = 0x3C00;
    for (int j = 0; j < 32; j++) {
        q[0].qs[j] = (int8_t)(j - 16);
        q[1].qs[j] = (int8_t)j;
    }
    ember_matrix m = {.type = EMBER_TYPE_Q8_0, .data = q, .n_in = 32, .n_out = 2, .row_bytes = sizeof q[0]};
    float row[32];
    ember_kernels_reference.get_row(&m, 0, row);
    CHECK(row[0] == -8.0f && row[16] == 0.0f && row[31] == 7.5f);
    ember_kernels_reference.get_row(&m, 1, row);
    CHECK(row[0] == 0.0f && row[5] == 5.0f && row[31] == 31.0f);
    /* x0 = all ones: sums 0.5 * (496 - 512) = -8 and 496; x1 = e_5: -5.5 and 5 */
    float x[64] = {0};
    for (int j = 0; j < 32; j++) x[j] = 1.0f;
    x[32 + 5] = 1.0f;
    float y[4] = {0};
    test_matmul(&ember_kernels_reference, &m, x, y, 2);
    CHECK_MSG(y[0] == -8.0f && y[1] == 496.0f && y[2] == -5.5f && y[3] == 5.0f, "q8_0: y = [%g %g %g %g]", y[0], y[1],
              y[2], y[3]);

    /* Two blocks per row: d differs per block. Row = [block d=2, q=1..] [block d=0.25, q=-4]. */
    ember_block_q8_0 two[2];
    two[0].d = 0x4000;
    two[1].d = 0x3400;
    for (int j = 0; j < 32; j++) {
        two[0].qs[j] = 1;
        two[1].qs[j] = -4;
    }
    ember_matrix m2 = {.type = EMBER_TYPE_Q8_0, .data = two, .n_in = 64, .n_out = 1, .row_bytes = sizeof two};
    float ones[64];
    for (int j = 0; j < 64; j++) ones[j] = 1.0f;
    float y2 = 0;
    test_matmul(&ember_kernels_reference, &m2, ones, &y2, 1);
    CHECK_MSG(y2 == 32.0f * 2.0f - 32.0f * 1.0f, "two blocks: %g", y2); /* 64 - 32 */

    const float a[4] = {1, 2, 3, 4}, b[4] = {0.5f, -1, 2, 0.25f};
    CHECK(ember_kernels_reference.dot_f32(a, b, 4) == 0.5f - 2 + 6 + 1);
}

/* ---- small ops ------------------------------------------------------------------------------- */

static void test_norms(void) {
    float y[4];
    const float x[2] = {1, 7}; /* mean square 25 -> rms 5 */
    ember_rmsnorm(y, x, NULL, 2, 0.0f);
    CHECK_NEAR(y[0], 0.2, 1e-7);
    CHECK_NEAR(y[1], 1.4, 1e-6);
    const float w[2] = {10, -0.5f};
    ember_rmsnorm(y, x, w, 2, 0.0f);
    CHECK_NEAR(y[0], 2.0, 1e-6);
    CHECK_NEAR(y[1], -0.7, 1e-6);
    ember_rmsnorm(y, x, NULL, 2, 24.0f); /* sqrt(25 + 24) = 7 */
    CHECK_NEAR(y[0], 1.0 / 7.0, 1e-7);
    CHECK_NEAR(y[1], 1.0, 1e-6);
    float inplace[2] = {1, 7};
    ember_rmsnorm(inplace, inplace, NULL, 2, 0.0f);
    CHECK_NEAR(inplace[1], 1.4, 1e-6);

    const float z[2] = {0, 2}; /* mean 1, variance 1 */
    ember_layernorm(y, z, NULL, NULL, 2, 0.0f);
    CHECK_NEAR(y[0], -1.0, 1e-6);
    CHECK_NEAR(y[1], 1.0, 1e-6);
    const float lw[2] = {3, 0.5f}, lb[2] = {1, 1};
    ember_layernorm(y, z, lw, lb, 2, 0.0f);
    CHECK_NEAR(y[0], -2.0, 1e-6);
    CHECK_NEAR(y[1], 1.5, 1e-6);
    ember_layernorm(y, z, NULL, NULL, 2, 3.0f); /* sqrt(1 + 3) = 2 */
    CHECK_NEAR(y[0], -0.5, 1e-6);
    CHECK_NEAR(y[1], 0.5, 1e-6);
    const float four[4] = {1, 2, 3, 4}; /* mean 2.5, variance 1.25 */
    ember_layernorm(y, four, NULL, NULL, 4, 0.0f);
    CHECK_NEAR(y[0], -1.5 / sqrt(1.25), 1e-6);
    CHECK_NEAR(y[3], 1.5 / sqrt(1.25), 1e-6);
}

/* Rotates (a, b) by theta: what one RoPE pair must become. */
static void rot(double a, double b, double theta, double *ra, double *rb) {
    *ra = a * cos(theta) - b * sin(theta);
    *rb = a * sin(theta) + b * cos(theta);
}

static void test_rope(void) {
    /* head of 6 values, 4 rotated; base 10000 -> pair frequencies 1 and 10000^(-2/4) = 0.01 */
    double e[6];
    float x[6] = {1, 2, 3, 4, 5, 6};
    ember_rope(x, 4, 1, 10000.0f, false, NULL); /* normal: pairs (0,1) and (2,3) */
    rot(1, 2, 1.0, &e[0], &e[1]);
    rot(3, 4, 0.01, &e[2], &e[3]);
    for (int i = 0; i < 4; i++) CHECK_NEAR(x[i], e[i], 1e-6);
    CHECK(x[4] == 5 && x[5] == 6); /* past n_rot: untouched */

    float y[6] = {1, 2, 3, 4, 5, 6};
    ember_rope(y, 4, 1, 10000.0f, true, NULL); /* neox: pairs (0,2) and (1,3) */
    rot(1, 3, 1.0, &e[0], &e[2]);
    rot(2, 4, 0.01, &e[1], &e[3]);
    for (int i = 0; i < 4; i++) CHECK_NEAR(y[i], e[i], 1e-6);
    CHECK(y[4] == 5 && y[5] == 6);

    /* position 7 and frequency factors: each pair's frequency is divided by its factor */
    const float ff[2] = {2.0f, 4.0f};
    float z[4] = {1, 2, 3, 4};
    ember_rope(z, 4, 7, 10000.0f, false, ff);
    rot(1, 2, 7 * 1.0 / 2.0, &e[0], &e[1]);
    rot(3, 4, 7 * 0.01 / 4.0, &e[2], &e[3]);
    for (int i = 0; i < 4; i++) CHECK_NEAR(z[i], e[i], 1e-6);
    float zn[4] = {1, 2, 3, 4};
    ember_rope(zn, 4, 7, 10000.0f, true, ff);
    rot(1, 3, 7 * 1.0 / 2.0, &e[0], &e[2]);
    rot(2, 4, 7 * 0.01 / 4.0, &e[1], &e[3]);
    for (int i = 0; i < 4; i++) CHECK_NEAR(zn[i], e[i], 1e-6);

    /* 8 dims, base 100: frequencies 1, 100^(-1/4), 100^(-1/2), 100^(-3/4); position 100 */
    float w[8] = {1, -1, 0.5f, 2, -3, 0.25f, 1, 1};
    float w0[8];
    memcpy(w0, w, sizeof w);
    ember_rope(w, 8, 100, 100.0f, true, NULL);
    for (int i = 0; i < 4; i++) {
        double a, b;
        rot(w0[i], w0[i + 4], 100.0 * pow(100.0, -i / 4.0), &a, &b);
        CHECK_NEAR(w[i], a, 2e-5);
        CHECK_NEAR(w[i + 4], b, 2e-5);
    }

    float p0[4] = {1, 2, 3, 4}; /* position 0 is the identity */
    ember_rope(p0, 4, 0, 10000.0f, true, NULL);
    CHECK(p0[0] == 1 && p0[1] == 2 && p0[2] == 3 && p0[3] == 4);
}

static void test_activations(void) {
    float s[3] = {0, logf(2), logf(4)}; /* e^x = 1, 2, 4 -> /7 */
    ember_softmax(s, 3);
    CHECK_NEAR(s[0], 1.0 / 7, 1e-7);
    CHECK_NEAR(s[1], 2.0 / 7, 1e-7);
    CHECK_NEAR(s[2], 4.0 / 7, 1e-7);
    float big[2] = {1000, 1000}; /* max-subtracted: no overflow */
    ember_softmax(big, 2);
    CHECK(big[0] == 0.5f && big[1] == 0.5f);
    float masked[2] = {-INFINITY, 0};
    ember_softmax(masked, 2);
    CHECK(masked[0] == 0.0f && masked[1] == 1.0f);

    CHECK(ember_silu(0) == 0);
    CHECK_NEAR(ember_silu(1), 0.7310585786, 1e-7);
    CHECK_NEAR(ember_silu(-1), -0.2689414214, 1e-7);
    CHECK_NEAR(ember_silu(2), 1.7615941560, 1e-6);
    CHECK_NEAR(ember_silu(-3), -0.1422776195, 1e-7);
    CHECK_NEAR(ember_silu(30), 30.0, 1e-5);
    CHECK(isfinite(ember_silu(-100)) && fabsf(ember_silu(-100)) < 1e-30f);

    CHECK(ember_gelu_tanh(0) == 0);
    CHECK_NEAR(ember_gelu_tanh(1), 0.8411919906, 1e-7);
    CHECK_NEAR(ember_gelu_tanh(-1), -0.1588080094, 1e-7);
    CHECK_NEAR(ember_gelu_tanh(2), 1.9545976941, 1e-6);
    CHECK_NEAR(ember_gelu_tanh(-3), -0.0036373921, 1e-7);
    CHECK_NEAR(ember_gelu_tanh(0.5f), 0.3457140098, 1e-7);
    CHECK_NEAR(ember_gelu_tanh(10), 10.0, 1e-5);
}

/* ---- sampler --------------------------------------------------------------------------------- */

static ember_sampler *sampler(float temp, int top_k, float top_p, uint64_t seed, int64_t n) {
    ember_sampler_params p = {.temperature = temp, .top_k = top_k, .top_p = top_p, .seed = seed};
    ember_sampler *s = NULL;
    ember_error err = {0};
    CHECK_MSG(ember_sampler_new(&p, n, &s, &err) == EMBER_OK, "%.900s", err.msg);
    return s;
}

static void test_sampler(void) {
    const float ties[5] = {1, 3, 3, 2, -1};
    CHECK(ember_argmax(ties, 5) == 1);
    const float lead[5] = {0.1f, 0.2f, 0.3f, 0.4f, 0.35f};
    CHECK(ember_argmax(lead, 5) == 3);

    ember_sampler *g = sampler(0, 0, 1, 0, 5);
    if (!g) return;
    CHECK(ember_sampler_sample(g, ties) == 1);
    CHECK(ember_sampler_sample(g, lead) == 3);
    ember_sampler_free(g);

    /* Near-uniform logits: sampling really samples, and a seed reproduces the sequence. */
    const float flat[8] = {0.1f, 0.0f, 0.2f, 0.05f, 0.15f, 0.1f, 0.0f, 0.12f};
    ember_sampler *a = sampler(1, 0, 1, 42, 8), *b = sampler(1, 0, 1, 42, 8), *c = sampler(1, 0, 1, 43, 8);
    int32_t sa[200], sb[200], sc[200];
    bool all_same = true;
    for (int i = 0; i < 200; i++) {
        sa[i] = ember_sampler_sample(a, flat);
        sb[i] = ember_sampler_sample(b, flat);
        sc[i] = ember_sampler_sample(c, flat);
        CHECK(sa[i] >= 0 && sa[i] < 8);
        if (sa[i] != sa[0]) all_same = false;
    }
    CHECK(memcmp(sa, sb, sizeof sa) == 0);
    CHECK(memcmp(sa, sc, sizeof sa) != 0); /* another seed: another sequence */
    CHECK(!all_same);
    ember_sampler_free(a);
    ember_sampler_free(b);
    ember_sampler_free(c);

    /* top_k = 1 and a tiny top_p both reduce to greedy, ties included. */
    ember_sampler *k1 = sampler(1.5f, 1, 1, 7, 5), *p0 = sampler(1.5f, 0, 1e-6f, 7, 5);
    bool k1_greedy = true, p0_greedy = true;
    for (int i = 0; i < 100; i++) {
        k1_greedy &= ember_sampler_sample(k1, lead) == 3 && ember_sampler_sample(k1, ties) == 1;
        p0_greedy &= ember_sampler_sample(p0, lead) == 3 && ember_sampler_sample(p0, ties) == 1;
    }
    CHECK(k1_greedy);
    CHECK(p0_greedy);
    ember_sampler_free(k1);
    ember_sampler_free(p0);

    /* Temperature 1 over logits {0, ln 3}: id 1 with probability 3/4. */
    const float two[2] = {0, logf(3)};
    ember_sampler *d = sampler(1, 0, 1, 2024, 2);
    int ones = 0;
    for (int i = 0; i < 8000; i++) ones += ember_sampler_sample(d, two) == 1;
    CHECK_MSG(fabs(ones / 8000.0 - 0.75) < 0.025, "id 1 drawn %d of 8000 times", ones);
    ember_sampler_free(d);

    /* Bad parameters are errors that say what was wrong. */
    ember_sampler_params bad = {.temperature = -1, .top_p = 1};
    ember_sampler *s = NULL;
    ember_error err = {0};
    CHECK(ember_sampler_new(&bad, 5, &s, &err) == EMBER_ERR_ARG && s == NULL && strstr(err.msg, "temperature"));
    bad = (ember_sampler_params){.temperature = 1, .top_p = 0};
    CHECK(ember_sampler_new(&bad, 5, &s, &err) == EMBER_ERR_ARG && s == NULL);
    bad = (ember_sampler_params){.temperature = 1, .top_p = 1};
    CHECK(ember_sampler_new(&bad, 0, &s, &err) == EMBER_ERR_ARG && s == NULL);
}

int main(void) {
    test_f16();
    test_bf16();
    test_matrices();
    test_norms();
    test_rope();
    test_activations();
    test_sampler();
    return ember_test_finish();
}
