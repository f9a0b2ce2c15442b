/* simd_common.h — what avx2.c and avx512.c share so they compute bit-identical results: the
 * 16-lane reduction tree, the scalar tails, and the exp/silu/gelu formulas written op by op.
 * Include only from files compiled with at least -mavx2 -mfma -mf16c -ffp-contract=off.
 *
 * The common order of operations (docs/kernels.md):
 *  - a reduction over n values keeps 16 lane accumulators, starting at +0: element i < n16 (n
 *    rounded down to a multiple of 16) goes to lane i % 16, in increasing i; the lanes are then
 *    summed by the tree below; elements n16..n-1 are added to that scalar one by one.
 *    AVX-512 holds the 16 lanes in one register, AVX2 in two (lanes 0-7, 8-15).
 *  - element-wise ops evaluate the same formula per element, vector lane or scalar tail alike.
 *  - Q8_0 products have their own order (q8_groups.h). */
#ifndef EMBER_SIMD_COMMON_H
#define EMBER_SIMD_COMMON_H

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels.h"

#define EMBER_AI static inline __attribute__((always_inline))

/* The 16-lane tree: v[l] = a[l] + a[l+8] (l < 8), then + 4 apart, + 2 apart, + 1 apart.
 * lo holds lanes 0-7, hi lanes 8-15. */
/* Keeps v in a register at this point, so the compiler cannot move the integer adds around it.
 * Without it GCC rebalances a long chain of vector integer adds into a tree (legal for wrapping
 * integers): every product is computed first and they spill to the stack. No instruction. */
EMBER_AI void ember_pin256(__m256i *v) { __asm__("" : "+x"(*v)); }

EMBER_AI float ember_reduce16(__m256 lo, __m256 hi) {
    __m256 b = _mm256_add_ps(lo, hi);
    __m128 c = _mm_add_ps(_mm256_castps256_ps128(b), _mm256_extractf128_ps(b, 1));
    __m128 d = _mm_add_ps(c, _mm_movehl_ps(c, c));
    __m128 e = _mm_add_ss(d, _mm_movehdup_ps(d));
    return _mm_cvtss_f32(e);
}

/* max over x[0..n) of the values that are not NaN (-INFINITY if none): what the scalar loop
 * m = x[j] > m ? x[j] : m computes, with 16 lanes instead of one latency-bound chain (maxps returns
 * its second operand for a NaN or equal pair, as the loop keeps m). Max is exact, so only the sign
 * of a zero maximum may differ from the loop's, and no caller's result depends on it (exp(s - m),
 * comparisons). */
EMBER_AI float ember_max_row(const float *x, int64_t n) {
    __m256 a = _mm256_set1_ps(-INFINITY), b = a;
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        a = _mm256_max_ps(_mm256_loadu_ps(x + j), a);
        b = _mm256_max_ps(_mm256_loadu_ps(x + j + 8), b);
    }
    a = _mm256_max_ps(a, b);
    __m128 c = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    c = _mm_max_ps(c, _mm_movehl_ps(c, c));
    c = _mm_max_ss(c, _mm_movehdup_ps(c));
    float m = _mm_cvtss_f32(c);
    for (; j < n; j++) m = x[j] > m ? x[j] : m;
    return m;
}

EMBER_AI uint16_t ember_load_u16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* f16 -> f32 through F16C (exact, like ember_f16_to_f32). */
EMBER_AI float ember_h2f(uint16_t h) { return _cvtsh_ss(h); }

/* Weight i of an f32 / f16 / bf16 row as f32 (exact conversions): the scalar tails of the float
 * products. One loader per type; the products take theirs as a compile-time argument. */
EMBER_AI float ember_weight_f32(const uint8_t *row, int64_t i) {
    float f;
    memcpy(&f, row + 4 * i, 4);
    return f;
}
EMBER_AI float ember_weight_f16(const uint8_t *row, int64_t i) { return ember_h2f(ember_load_u16(row + 2 * i)); }
EMBER_AI float ember_weight_bf16(const uint8_t *row, int64_t i) {
    uint32_t bits = (uint32_t)ember_load_u16(row + 2 * i) << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* ---- exp and friends: vector lanes and scalar tails follow these exact steps ----
 * exp(x): x clamped to [-87, 88] (NaN stays NaN); n = rint(x / ln 2); r = x - n*C1 - n*C2 (two
 * fused steps, C1 + C2 = ln 2); p = degree-7 Taylor polynomial of e^r by Horner with fused
 * multiply-adds; result p * 2^n with 2^n built from its exponent bits. Error about 2 ulp. */
#define EMBER_EXP_LO (-87.0f)
#define EMBER_EXP_HI 88.0f
#define EMBER_LOG2E 1.44269504088896341f
#define EMBER_EXP_C1 0.693359375f
#define EMBER_EXP_C2 (-2.12194440e-4f)
#define EMBER_EXP_P7 (1.0f / 5040.0f)
#define EMBER_EXP_P6 (1.0f / 720.0f)
#define EMBER_EXP_P5 (1.0f / 120.0f)
#define EMBER_EXP_P4 (1.0f / 24.0f)
#define EMBER_EXP_P3 (1.0f / 6.0f)
#define EMBER_EXP_P2 0.5f
#define EMBER_GELU_K 0.79788456080286535588f /* sqrt(2/pi) */
#define EMBER_GELU_A 0.044715f

EMBER_AI float ember_s_exp(float x) {
    x = EMBER_EXP_LO > x ? EMBER_EXP_LO : x; /* the vector max(lo, x): NaN passes through */
    x = EMBER_EXP_HI < x ? EMBER_EXP_HI : x;
    float n = nearbyintf(x * EMBER_LOG2E);
    float r = fmaf(-n, EMBER_EXP_C1, x);
    r = fmaf(-n, EMBER_EXP_C2, r);
    float p = EMBER_EXP_P7;
    p = fmaf(p, r, EMBER_EXP_P6);
    p = fmaf(p, r, EMBER_EXP_P5);
    p = fmaf(p, r, EMBER_EXP_P4);
    p = fmaf(p, r, EMBER_EXP_P3);
    p = fmaf(p, r, EMBER_EXP_P2);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    int32_t ni = n == n ? (int32_t)n : 0; /* n in [-126, 127] */
    uint32_t bits = (uint32_t)(ni + 127) << 23;
    float scale;
    memcpy(&scale, &bits, 4);
    return p * scale;
}

/* silu(x) = x / (1 + exp(-x)) */
EMBER_AI float ember_s_silu(float x) { return x / (1.0f + ember_s_exp(-x)); }

/* gelu_tanh(x) = 0.5 x (1 + tanh(u)) with u = k ((a x) x x + x), computed as x / (1 + exp(-2u)):
 * the same function (1 + tanh(u) = 2 / (1 + exp(-2u))) without the cancellation of 1 + tanh(u)
 * for negative u, so the tiny negative tail keeps its relative accuracy. */
EMBER_AI float ember_s_gelu(float x) {
    float a = EMBER_GELU_A * x;
    a = a * x;
    a = a * x;
    float u = EMBER_GELU_K * (x + a);
    return x / (1.0f + ember_s_exp(-(u + u)));
}

#endif
