/* test_quants.c — the 4- to 6-bit GGUF blocks and Q8_K (src/kernels/quants.h): dequantization of
 * hand-built blocks against hand-computed values, quantizers on hand-computed cases, and
 * quantize -> dequantize error budgets (NMSE) per type. llama.cpp agreement: test_quants_llamacpp.c. */
#include "quants.h"
#include "kernels.h"
#include "test_support.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* f16 bit patterns of the scales used below (exact in f16) */
#define H_1 0x3C00       /* 1.0 */
#define H_HALF 0x3800    /* 0.5 */
#define H_QUARTER 0x3400 /* 0.25 */
#define H_2 0x4000       /* 2.0 */
#define H_M1 0xBC00      /* -1.0 */

static int count_mismatch(const float *got, const double *want, int n, int *first) {
    int bad = 0;
    *first = -1;
    for (int i = 0; i < n; i++)
        if ((double)got[i] != want[i]) {
            if (*first < 0) *first = i;
            bad++;
        }
    return bad;
}

#define CHECK_VALUES(name, got, want, n)                                                                               \
    do {                                                                                                               \
        int f_;                                                                                                        \
        int bad_ = count_mismatch(got, want, n, &f_);                                                                  \
        CHECK_MSG(bad_ == 0, "%s: %d of %d values differ, first at %d: got %.9g want %.9g", name, bad_, n, f_,         \
                  f_ >= 0 ? (double)(got)[f_] : 0.0, f_ >= 0 ? (want)[f_] : 0.0);                                      \
    } while (0)

/* ---- dequantization of hand-built blocks ---- */

static void test_dequant_q4_0(void) {
    ember_block_q4_0 b[2];
    b[0].d = H_HALF;
    for (int j = 0; j < 16; j++) b[0].qs[j] = (uint8_t)(j | (15 - j) << 4);
    b[1].d = H_M1;
    memset(b[1].qs, 0x8F, 16); /* low nibble 15 -> +7 * -1, high nibble 8 -> 0 */
    double want[64];
    for (int j = 0; j < 16; j++) {
        want[j] = (j - 8) * 0.5;      /* low nibbles: values 0..15 */
        want[16 + j] = (7 - j) * 0.5; /* high nibbles 15-j: values 16..31 */
        want[32 + j] = -7.0;
        want[48 + j] = 0.0;
    }
    float got[64];
    ember_dequantize_row_q4_0(b, got, 64);
    CHECK_VALUES("q4_0", got, want, 64);
    CHECK(got[0] == -4.0f && got[16] == 3.5f && got[15] == 3.5f && got[31] == -4.0f);
}

static void test_dequant_q4_1(void) {
    ember_block_q4_1 b;
    b.d = H_QUARTER;
    b.m = H_M1;
    for (int j = 0; j < 16; j++) b.qs[j] = (uint8_t)(j | (15 - j) << 4);
    double want[32];
    for (int j = 0; j < 16; j++) {
        want[j] = j * 0.25 - 1.0;
        want[16 + j] = (15 - j) * 0.25 - 1.0;
    }
    float got[32];
    ember_dequantize_row_q4_1(&b, got, 32);
    CHECK_VALUES("q4_1", got, want, 32);
    CHECK(got[0] == -1.0f && got[16] == 2.75f);
}

static void test_dequant_q5_0(void) {
    ember_block_q5_0 b;
    b.d = H_2;
    /* qh = 0x8000_0001 (little-endian bytes 01 00 00 80): value 0 and value 31 get the fifth bit */
    b.qh[0] = 0x01;
    b.qh[1] = 0x00;
    b.qh[2] = 0x00;
    b.qh[3] = 0x80;
    for (int j = 0; j < 16; j++) b.qs[j] = (uint8_t)(j | j << 4);
    double want[32];
    for (int j = 0; j < 16; j++) {
        want[j] = (j - 16) * 2.0;
        want[16 + j] = (j - 16) * 2.0;
    }
    want[0] = (16 + 0 - 16) * 2.0;   /* 0 | 16 */
    want[31] = (16 + 15 - 16) * 2.0; /* 15 | 16 */
    float got[32];
    ember_dequantize_row_q5_0(&b, got, 32);
    CHECK_VALUES("q5_0", got, want, 32);
    CHECK(got[0] == 0.0f && got[1] == -30.0f && got[31] == 30.0f && got[16] == -32.0f);
}

static void test_dequant_q5_1(void) {
    ember_block_q5_1 b;
    b.d = H_HALF;
    b.m = H_2;
    /* qh bytes 0xF0 0x00 0x0F 0x00 -> bits 4..7 (values 4-7) and 16..19 (values 16-19) */
    b.qh[0] = 0xF0;
    b.qh[1] = 0x00;
    b.qh[2] = 0x0F;
    b.qh[3] = 0x00;
    for (int j = 0; j < 16; j++) b.qs[j] = (uint8_t)(3 | 9 << 4);
    double want[32];
    for (int j = 0; j < 32; j++) {
        int q = j < 16 ? 3 : 9;
        if ((j >= 4 && j <= 7) || (j >= 16 && j <= 19)) q += 16;
        want[j] = q * 0.5 + 2.0;
    }
    float got[32];
    ember_dequantize_row_q5_1(&b, got, 32);
    CHECK_VALUES("q5_1", got, want, 32);
    CHECK(got[0] == 3.5f && got[4] == 11.5f && got[16] == 14.5f && got[20] == 6.5f);
}

/* Q4_K/Q5_K sub-block scales and mins, packed by hand into the 12 bytes (see the comment in
 * quants_dequant.c: 6 bits each, the top 2 bits of sub-blocks 4-7 in bytes 0-7's top bits). */
static const int K4_SC[8] = {1, 2, 3, 4, 33, 40, 63, 17};
static const int K4_M[8] = {0, 1, 2, 3, 48, 5, 63, 32};
static const uint8_t K4_PACKED[12] = {0x81, 0x82, 0xC3, 0x44, 0xC0, 0x01, 0xC2, 0x83, 0x01, 0x58, 0xFF, 0x01};

static void test_dequant_q4_k(void) {
    ember_block_q4_K b;
    b.d = H_HALF;
    b.dmin = H_QUARTER;
    memcpy(b.scales, K4_PACKED, 12);
    for (int i = 0; i < 128; i++) b.qs[i] = (uint8_t)((i % 16) | (15 - i % 16) << 4);
    double want[256];
    for (int v = 0; v < 256; v++) {
        int j = v / 32, i = v % 32;
        int q = j % 2 == 0 ? i % 16 : 15 - i % 16; /* even sub-blocks: low nibbles */
        want[v] = 0.5 * K4_SC[j] * q - 0.25 * K4_M[j];
    }
    float got[256];
    ember_dequantize_row_q4_k(&b, got, 256);
    CHECK_VALUES("q4_K", got, want, 256);
    /* spot values worked out by hand: sub-block 6 (scale 63, min 63), quant 15 and 0 */
    CHECK(got[6 * 32 + 15] == 0.5f * 63 * 15 - 0.25f * 63);
    CHECK(got[7 * 32] == 0.5f * 17 * 15 - 0.25f * 32); /* 119.5 */
    CHECK(got[7 * 32] == 119.5f);
}

static void test_dequant_q5_k(void) {
    ember_block_q5_K b;
    b.d = H_QUARTER;
    b.dmin = H_1;
    memcpy(b.scales, K4_PACKED, 12);
    for (int i = 0; i < 128; i++) b.qs[i] = (uint8_t)((i % 16) | (15 - i % 16) << 4);
    for (int i = 0; i < 32; i++) b.qh[i] = (uint8_t)(i * 37 + 11);
    double want[256];
    for (int v = 0; v < 256; v++) {
        int j = v / 32, i = v % 32;
        int q = j % 2 == 0 ? i % 16 : 15 - i % 16;
        if ((((i * 37 + 11) & 0xFF) >> j) & 1) q += 16;
        want[v] = 0.25 * K4_SC[j] * q - 1.0 * K4_M[j];
    }
    float got[256];
    ember_dequantize_row_q5_k(&b, got, 256);
    CHECK_VALUES("q5_K", got, want, 256);
    /* qh[0] = 11 = 0b00001011: sub-blocks 0, 1 and 3 have the fifth bit on value 0 */
    CHECK(got[0] == 0.25f * 1 * 16 - 0.0f);
    CHECK(got[32] == 0.25f * 2 * (15 + 16) - 1.0f);
    CHECK(got[64] == 0.25f * 3 * 0 - 2.0f);
}

static void test_dequant_q6_k(void) {
    ember_block_q6_K b;
    b.d = H_QUARTER;
    static const int8_t sc[16] = {1, -2, 3, -4, 5, -6, 7, -8, 127, -128, 10, 0, 2, 2, -1, 64};
    memcpy(b.scales, sc, 16);
    /* levels chosen per value, packed by the layout in quants_dequant.c */
    int level[256];
    for (int v = 0; v < 256; v++) level[v] = (v * 7 + 3) % 64;
    memset(b.ql, 0, sizeof b.ql);
    memset(b.qh, 0, sizeof b.qh);
    for (int v = 0; v < 256; v++) {
        int h = v / 128, k = (v % 128) / 32, i = v % 32;
        int byte = h * 64 + 32 * (k % 2) + i;
        b.ql[byte] = (uint8_t)(b.ql[byte] | (level[v] & 0xF) << (k < 2 ? 0 : 4));
        b.qh[h * 32 + i] = (uint8_t)(b.qh[h * 32 + i] | (level[v] >> 4) << (2 * k));
    }
    double want[256];
    for (int v = 0; v < 256; v++) want[v] = 0.25 * sc[v / 16] * (level[v] - 32);
    float got[256];
    ember_dequantize_row_q6_k(&b, got, 256);
    CHECK_VALUES("q6_K", got, want, 256);
    /* by hand: value 0 has level 3 -> 0.25 * 1 * (3 - 32); value 64 lies in ql[0]'s high nibble */
    CHECK(got[0] == -7.25f);
    CHECK((b.ql[0] & 0xF) == 3 && (b.ql[0] >> 4) == ((64 * 7 + 3) % 64 & 0xF));
    CHECK(got[128 + 16] == 0.25f * -128 * (((128 + 16) * 7 + 3) % 64 - 32));
}

static void test_dequant_q2_k(void) {
    ember_block_q2_K b;
    b.d = H_HALF;
    b.dmin = H_QUARTER;
    for (int j = 0; j < 16; j++) b.scales[j] = (uint8_t)((j % 16) | ((15 - j) % 16) << 4);
    int level[256];
    for (int v = 0; v < 256; v++) level[v] = (v * 5 + v / 64) % 4;
    memset(b.qs, 0, sizeof b.qs);
    for (int v = 0; v < 256; v++) {
        int h = v / 128, k = (v % 128) / 32, i = v % 32;
        b.qs[h * 32 + i] = (uint8_t)(b.qs[h * 32 + i] | level[v] << (2 * k));
    }
    double want[256];
    for (int v = 0; v < 256; v++) want[v] = 0.5 * (v / 16) * level[v] - 0.25 * (15 - v / 16);
    float got[256];
    ember_dequantize_row_q2_k(&b, got, 256);
    CHECK_VALUES("q2_K", got, want, 256);
    CHECK(got[0] == -3.75f); /* scale 0, min 15 */
}

static void test_dequant_q3_k(void) {
    ember_block_q3_K b;
    b.d = H_HALF;
    /* signed scales s_j in [-32, 31], stored s_j + 32 as 6 bits */
    int s[16];
    for (int j = 0; j < 16; j++) s[j] = j * 4 - 32 + (j == 15 ? 3 : 0); /* -32 .. 31 */
    memset(b.scales, 0, 12);
    for (int j = 0; j < 16; j++) {
        int l = s[j] + 32;
        if (j < 8) b.scales[j] = (uint8_t)(b.scales[j] | (l & 0xF));
        else b.scales[j - 8] = (uint8_t)(b.scales[j - 8] | (l & 0xF) << 4);
        b.scales[8 + j % 4] = (uint8_t)(b.scales[8 + j % 4] | (l >> 4) << (2 * (j / 4)));
    }
    int q[256]; /* in [-4, 3] */
    for (int v = 0; v < 256; v++) q[v] = (v * 3 + v / 32) % 8 - 4;
    memset(b.qs, 0, sizeof b.qs);
    memset(b.hmask, 0, sizeof b.hmask);
    for (int v = 0; v < 256; v++) {
        int l = q[v] + 4, h = v / 128, k = (v % 128) / 32, i = v % 32;
        if (l > 3) b.hmask[i] = (uint8_t)(b.hmask[i] | 1 << (v / 32)); /* set bit: no -4 */
        b.qs[h * 32 + i] = (uint8_t)(b.qs[h * 32 + i] | (l & 3) << (2 * k));
    }
    double want[256];
    for (int v = 0; v < 256; v++) want[v] = 0.5 * s[v / 16] * q[v];
    float got[256];
    ember_dequantize_row_q3_k(&b, got, 256);
    CHECK_VALUES("q3_K", got, want, 256);
    CHECK(got[0] == 0.5f * -32 * -4);
}

static void test_dequant_q8_k(void) {
    ember_block_q8_K b;
    memset(&b, 0, sizeof b);
    b.d = 0.125f;
    for (int i = 0; i < 256; i++) b.qs[i] = (int8_t)(i - 128 < -127 ? -127 : i - 128);
    double want[256];
    for (int i = 0; i < 256; i++) want[i] = 0.125 * b.qs[i];
    float got[256];
    ember_dequantize_row_q8_k(&b, got, 256);
    CHECK_VALUES("q8_K", got, want, 256);
    CHECK(got[255] == 15.875f);
}

/* ---- quantizers on cases worked out by hand ---- */

static void test_quantize_hand(void) {
    /* Q4_0 of x_j = j - 16: the largest magnitude is x_0 = -16, so d = -16 / -8 = 2, and
     * q_j = min(15, trunc((j - 16) / 2 + 8.5)) = floor((j + 1) / 2) except q_31 = 15. */
    float x[32];
    for (int j = 0; j < 32; j++) x[j] = (float)(j - 16);
    ember_block_q4_0 q4;
    ember_quantize_row_q4_0(x, &q4, 32);
    CHECK(q4.d == H_2);
    bool ok = true;
    for (int j = 0; j < 32; j++) {
        int want = j == 31 ? 15 : (j + 1) / 2;
        int got = j < 16 ? q4.qs[j] & 0xF : q4.qs[j - 16] >> 4;
        ok = ok && got == want;
    }
    CHECK_MSG(ok, "q4_0 levels of x_j = j - 16");

    /* Q4_1 of the same: min -16, d = 31 / 15 (rounded to f16), q_j = trunc((j) * 15/31 + 0.5) */
    ember_block_q4_1 q41;
    ember_quantize_row_q4_1(x, &q41, 32);
    CHECK(q41.m == ember_f32_to_f16(-16.0f));
    CHECK(q41.d == ember_f32_to_f16(31.0f / 15.0f));
    CHECK((q41.qs[0] & 0xF) == 0 && (q41.qs[15] >> 4) == 15); /* x_0 = min, x_31 = max */
    CHECK((q41.qs[2] & 0xF) == 1);                            /* 2 * 15/31 + 0.5 = 1.47 */
    CHECK((q41.qs[3] & 0xF) == 1);                            /* 3 * 15/31 + 0.5 = 1.95 */

    /* Q5_0: d = -16 / -16 = 1; q_j = min(31, trunc(j - 16 + 16.5)) = j */
    ember_block_q5_0 q5;
    ember_quantize_row_q5_0(x, &q5, 32);
    CHECK(q5.d == H_1);
    float back[32];
    ember_dequantize_row_q5_0(&q5, back, 32);
    ok = true;
    for (int j = 0; j < 32; j++) ok = ok && back[j] == x[j];
    CHECK_MSG(ok, "q5_0 represents j - 16 exactly");

    /* Q8_K: a block whose largest magnitude is -2 maps it to -127... so x = -2 -> -127 with
     * d = 2/127, and x = 1 -> round(63.5) = 64 (ties to even) */
    float y[256];
    for (int i = 0; i < 256; i++) y[i] = 0.0f;
    y[0] = -2.0f;
    y[1] = 1.0f;
    y[17] = 2.0f;
    ember_block_q8_K q8;
    ember_quantize_row_q8_k(y, &q8, 256);
    CHECK(q8.qs[0] == -127 && q8.qs[1] == 64 && q8.qs[17] == 127);
    CHECK(q8.d == 1.0f / (-127.0f / -2.0f));
    CHECK(q8.bsums[0] == -127 + 64 && q8.bsums[1] == 127 && q8.bsums[2] == 0);
}

/* ---- quantize -> dequantize ---- */

typedef struct {
    const char *name;
    int64_t block, bytes;
    void (*quantize)(const float *, void *, int64_t);
    void (*dequantize)(const void *, float *, int64_t);
    double nmse_budget; /* pooled sum (x - x')^2 / sum x^2 over approximately normal data */
} qtype;

/* Budgets about 1.3x what this machine measures (comment), so a real regression shows. */
static const qtype TYPES[] = {
    {"q4_0", 32, 18, ember_quantize_row_q4_0, ember_dequantize_row_q4_0, 1.0e-2},    /* 7.6e-3 */
    {"q4_1", 32, 20, ember_quantize_row_q4_1, ember_dequantize_row_q4_1, 8.0e-3},    /* 6.0e-3 */
    {"q5_0", 32, 22, ember_quantize_row_q5_0, ember_dequantize_row_q5_0, 2.3e-3},    /* 1.8e-3 */
    {"q5_1", 32, 24, ember_quantize_row_q5_1, ember_dequantize_row_q5_1, 1.8e-3},    /* 1.4e-3 */
    {"q2_K", 256, 84, ember_quantize_row_q2_k, ember_dequantize_row_q2_k, 1.1e-1},   /* 8.7e-2 */
    {"q3_K", 256, 110, ember_quantize_row_q3_k, ember_dequantize_row_q3_k, 2.9e-2},  /* 2.2e-2 */
    {"q4_K", 256, 144, ember_quantize_row_q4_k, ember_dequantize_row_q4_k, 6.5e-3},  /* 5.1e-3 */
    {"q5_K", 256, 176, ember_quantize_row_q5_k, ember_dequantize_row_q5_k, 1.65e-3}, /* 1.3e-3 */
    {"q6_K", 256, 210, ember_quantize_row_q6_k, ember_dequantize_row_q6_k, 4.1e-4},  /* 3.1e-4 */
    {"q8_K", 256, 292, ember_quantize_row_q8_k, ember_dequantize_row_q8_k, 6.3e-5},  /* 4.8e-5 */
};
#define N_TYPES (sizeof TYPES / sizeof TYPES[0])

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double rng_uniform(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) * 0x1p-53;
}
static float rng_normal(void) {
    double s = 0;
    for (int i = 0; i < 12; i++) s += rng_uniform();
    return (float)(s - 6.0);
}

static void test_round_trip(void) {
    const int64_t n = 256 * 64;
    float *x = malloc(sizeof(float) * (size_t)n), *y = malloc(sizeof(float) * (size_t)n);
    void *q = malloc((size_t)n * 2);
    for (size_t t = 0; t < N_TYPES; t++) {
        const qtype *T = &TYPES[t];
        double err = 0, ref = 0;
        for (int rep = 0; rep < 4; rep++) {
            /* rows of different scales and an occasional outlier, as in weight matrices */
            float scale = (float)(0.02 * (rep + 1));
            for (int64_t i = 0; i < n; i++) x[i] = scale * rng_normal();
            x[rep * 97] *= 8.0f;
            T->quantize(x, q, n);
            T->dequantize(q, y, n);
            for (int64_t i = 0; i < n; i++) {
                err += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
                ref += (double)x[i] * x[i];
            }
        }
        double nmse = err / ref;
        printf("  %-5s nmse %.3g (budget %.3g)\n", T->name, nmse, T->nmse_budget);
        CHECK_MSG(nmse <= T->nmse_budget, "%s: NMSE %.4g over the budget %.4g", T->name, nmse, T->nmse_budget);
        CHECK_MSG(nmse > 0, "%s: a lossy type reproduced random data exactly", T->name);

        /* all-zero input: zeros back (every type has an exact zero) */
        memset(x, 0, sizeof(float) * 1024);
        T->quantize(x, q, 1024);
        T->dequantize(q, y, 1024);
        bool zero = true;
        for (int i = 0; i < 1024; i++) zero = zero && y[i] == 0.0f;
        CHECK_MSG(zero, "%s: zeros do not come back as zeros", T->name);

        /* deterministic: the same input gives the same bytes */
        for (int64_t i = 0; i < 1024; i++) x[i] = rng_normal();
        uint8_t *a = malloc((size_t)T->bytes * 1024 / T->block), *b = malloc((size_t)T->bytes * 1024 / T->block);
        T->quantize(x, a, 1024);
        T->quantize(x, b, 1024);
        CHECK_MSG(memcmp(a, b, (size_t)T->bytes * 1024 / T->block) == 0, "%s: quantization is not deterministic",
                  T->name);
        free(a);
        free(b);
    }
    free(x);
    free(y);
    free(q);
}

int main(void) {
    test_dequant_q4_0();
    test_dequant_q4_1();
    test_dequant_q5_0();
    test_dequant_q5_1();
    test_dequant_q2_k();
    test_dequant_q3_k();
    test_dequant_q4_k();
    test_dequant_q5_k();
    test_dequant_q6_k();
    test_dequant_q8_k();
    test_quantize_hand();
    test_round_trip();
    return ember_test_finish();
}
