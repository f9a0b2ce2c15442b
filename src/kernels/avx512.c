/* avx512.c — the AVX-512 kernel set (F, BW, VL, VNNI), compiled with its own -mavx512* flags and
 * called only after dispatch.c has checked CPUID and XCR0. It must follow the common order of
 * operations of simd_common.h / docs/kernels.md, which avx2.c reproduces bit for bit.
 *
 * Matrix products are register-tiled: R weight rows x T tokens of 16-lane accumulators, so each
 * weight vector loaded is used T times (prefill) and each activation vector R times. */
#include "half_convert.h"
#include "q8_groups.h"
#include "quant_dots.h"
#include "transposed_simd.h"

#include <stdlib.h>

/* ---- the fast Q8_0 transposed product (transposed_q8.h): the integer dot of one block ---- */

#define TQ_FLIP 0x80
/* VNNI: the panel's quants as u8 (q + 128) times hq (s8), four rows per lane; the 128 * sum(hq)
 * the offset added is taken off at the end (exact: every sum is an int32). */
static inline void tq_isums(const uint8_t *p, int64_t ps, const int8_t *hq, int64_t nq, int32_t hsum, int32_t *out) {
    __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
    for (int64_t r4 = 0; r4 < nq; r4++) {
        int32_t quad;
        memcpy(&quad, hq + 4 * r4, 4);
        const __m512i hb = _mm512_set1_epi32(quad);
        a0 = _mm512_dpbusd_epi32(a0, _mm512_loadu_si512(p + r4 * ps), hb);
        a1 = _mm512_dpbusd_epi32(a1, _mm512_loadu_si512(p + r4 * ps + 64), hb);
    }
    const __m512i off = _mm512_set1_epi32(128 * hsum);
    _mm512_storeu_si512(out, _mm512_sub_epi32(a0, off));
    _mm512_storeu_si512(out + 16, _mm512_sub_epi32(a1, off));
}
#include "transposed_q8.h"

/* ---- f32 / f16 / bf16 weights: f32 activations, one fused multiply-add per element ---- */

/* The 16-wide loaders of the float types (exact conversions to f32). */
static inline __m512 load16_f32(const uint8_t *row, int64_t i) { return _mm512_loadu_ps(row + 4 * i); }
static inline __m512 load16_f16(const uint8_t *row, int64_t i) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + 2 * i)));
}
static inline __m512 load16_bf16(const uint8_t *row, int64_t i) { /* bf16: the high half of an f32 */
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(row + 2 * i))), 16));
}
typedef __m512 (*load16_fn)(const uint8_t *row, int64_t i);
typedef float (*load1_fn)(const uint8_t *row, int64_t i);

EMBER_AI float reduce512(__m512 a) {
    return ember_reduce16(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
}

/* out[r*T + t] = row r . token t over n values, in the common order; load/load1 are the type's
 * loaders (constants at every call, so each instance is compiled for its type). */
EMBER_AI void float_tile(load16_fn load, load1_fn load1, const uint8_t *const *rows, const float *const *xs, int R,
                         int T, int64_t n, float *out) {
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    const int64_t n16 = n & ~(int64_t)15;
    for (int64_t i = 0; i < n16; i += 16) {
        __m512 xv[4];
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) xv[t] = _mm512_loadu_ps(xs[t] + i);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m512 wv = load(rows[r], i);
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) acc[r][t] = _mm512_fmadd_ps(wv, xv[t], acc[r][t]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            float s = reduce512(acc[r][t]);
            for (int64_t i = n16; i < n; i++) s = fmaf(load1(rows[r], i), xs[t][i], s);
            out[r * T + t] = s;
        }
}

/* ---- q8_0 weights x q8_0-quantized activations (q8_groups.h: layouts and order) ----
 * VNNI's vpdpbusd multiplies unsigned by signed bytes and adds groups of 4 products into an int32
 * lane: the weights go in as u8 = w + 128, the activation quants as s8, and each lane starts from
 * the block's -128 * (sum of its quants), so after the 8 steps of a quad the lane holds exactly
 * sum w q of its (row, block). */

/* Quantizes one token (ember_quantize_row_q8_0's scheme, bit for bit) into the prepared layout. */
static void q8_prepare(const float *x, uint8_t *xa, int64_t n_in) {
    const int64_t nb = n_in / EMBER_QK8_0;
    const __m512 inf = _mm512_set1_ps(INFINITY);
    for (int64_t b = 0; b < nb; b++) {
        int8_t q[32];
        __m512 v0 = _mm512_loadu_ps(x + b * 32), v1 = _mm512_loadu_ps(x + b * 32 + 16);
        __m512 a0 = _mm512_abs_ps(v0), a1 = _mm512_abs_ps(v1);
        __mmask16 bad = _mm512_cmp_ps_mask(a0, inf, _CMP_NLT_UQ) | _mm512_cmp_ps_mask(a1, inf, _CMP_NLT_UQ);
        if (bad) { /* NaN or infinity in the block: d = NaN, quants 0 (as ember_quantize_row_q8_0) */
            memset(q, 0, sizeof q);
            q8g_act_block(xa, nb, b, q, ember_h2f(0x7e00));
            continue;
        }
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1)); /* max is exact in any order */
        const uint16_t d16 = _cvtss_sh(amax / 127.0f, _MM_FROUND_TO_NEAREST_INT);
        const __m512 m = _mm512_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
        /* round half to even, like nearbyintf in the default mode; |values| <= 127 */
        __m512i i0 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(v0, m), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m512i i1 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(v1, m), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm_storeu_si128((__m128i *)q, _mm512_cvtsepi32_epi8(i0));
        _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtsepi32_epi8(i1));
        q8g_act_block(xa, nb, b, q, ember_h2f(d16));
    }
    q8g_act_pad(xa, nb);
}

/* Spans [s0, s1) of one 4-row group times T tokens (q8g_kernel_fn). A register's 16 lanes are the
 * (row, block) pairs of a quad of blocks; the activation side is the same 16 bytes for every row,
 * broadcast. Two integer chains per token (even and odd steps) hide vpdpbusd's latency. */
EMBER_AI void q8g_spans512(const uint8_t *g, const uint8_t *const *xs, int T, int64_t nb, int64_t s0, int64_t s1,
                           float *lanes, bool first, float *y, int64_t n_out, int rows) {
    const size_t odx = q8g_off_dx(nb), ocorr = q8g_off_corr(nb);
    __m512 acc[4];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) acc[t] = first ? _mm512_setzero_ps() : _mm512_load_ps(lanes + 16 * t);
    for (int64_t s = s0; s < s1; s++, g += Q8G_SPAN_BYTES) {
        const __m512i scales = _mm512_load_si512(g);
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const int64_t quad = 2 * s + h;
            const __m512 dw =
                _mm512_cvtph_ps(h ? _mm512_extracti64x4_epi64(scales, 1) : _mm512_castsi512_si256(scales));
            __m512i even[4], odd[4];
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                even[t] = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(xs[t] + ocorr + 16 * quad)));
                odd[t] = _mm512_setzero_si512();
            }
            const uint8_t *wq = g + 64 + 512 * h;
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) {
                const __m512i wv = _mm512_load_si512(wq + 64 * k);
#pragma GCC unroll 4
                for (int t = 0; t < T; t++) {
                    const __m512i a =
                        _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(xs[t] + 128 * quad + 16 * k)));
                    if (k & 1) odd[t] = _mm512_dpbusd_epi32(odd[t], wv, a);
                    else even[t] = _mm512_dpbusd_epi32(even[t], wv, a);
                }
            }
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                const __m512 dx = _mm512_broadcast_f32x4(_mm_loadu_ps((const float *)(xs[t] + odx) + 4 * quad));
                const __m512 isum = _mm512_cvtepi32_ps(_mm512_add_epi32(even[t], odd[t]));
                acc[t] = _mm512_fmadd_ps(isum, _mm512_mul_ps(dw, dx), acc[t]);
            }
        }
    }
    if (!y) {
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) _mm512_store_ps(lanes + 16 * t, acc[t]);
        return;
    }
    /* (p0 + p1) + (p2 + p3) in every 128-bit lane (one row each), then lanes 0, 4, 8, 12 */
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        const __m512 pairs = _mm512_add_ps(acc[t], _mm512_permute_ps(acc[t], 0xB1));
        const __m512 sums = _mm512_add_ps(pairs, _mm512_permute_ps(pairs, 0x4E));
        const __m128 out = _mm512_castps512_ps128(_mm512_maskz_compress_ps(0x1111, sums));
        if (rows == 4) _mm_storeu_ps(y + t * n_out, out);
        else _mm_mask_storeu_ps(y + t * n_out, (__mmask8)((1u << rows) - 1), out);
    }
}

/* One file-layout row times one token (q8g_row_fn), for decoding with weights read in place: a
 * quad of blocks is two registers of 2 blocks; each lane's 4 products (u8(w + 128) x s8 q) are
 * summed per block in integers, the block's -128 * sum q added, then one conversion and one fused
 * multiply-add per block into p[b % 4], as in the order. */
EMBER_AI __m256i q8_block_quants(const uint8_t *row, int64_t b, int64_t nb) {
    return b < nb ? _mm256_loadu_si256((const __m256i *)(row + b * sizeof(ember_block_q8_0) + 2))
                  : _mm256_set1_epi8((char)0x80); /* padding: weight 0 once flipped below */
}

static float q8g_row512(const uint8_t *row, const uint8_t *xa, int64_t nb) {
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    const uint8_t *plain = xa + q8g_off_plain(nb);
    const int32_t *corr = (const int32_t *)(xa + q8g_off_corr(nb));
    const float *dx = (const float *)(xa + q8g_off_dx(nb));
    __m128 p = _mm_setzero_ps();
    for (int64_t b = 0; b < nb; b += 4) {
        const __m512i w01 =
            _mm512_inserti64x4(_mm512_castsi256_si512(q8_block_quants(row, b, nb)), q8_block_quants(row, b + 1, nb), 1);
        const __m512i w23 = _mm512_inserti64x4(_mm512_castsi256_si512(q8_block_quants(row, b + 2, nb)),
                                               q8_block_quants(row, b + 3, nb), 1);
        const __m512i s01 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_xor_si512(w01, flip),
                                                _mm512_loadu_si512(plain + 32 * b));
        const __m512i s23 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_xor_si512(w23, flip),
                                                _mm512_loadu_si512(plain + 32 * b + 64));
        /* 8 lanes per block -> 4 (pairs), then within each 128-bit lane (one block) -> 1 */
        __m512i u =
            _mm512_add_epi32(_mm512_permutex2var_epi32(s01, even, s23), _mm512_permutex2var_epi32(s01, odd, s23));
        u = _mm512_add_epi32(u, _mm512_shuffle_epi32(u, _MM_PERM_BADC));
        u = _mm512_add_epi32(u, _mm512_shuffle_epi32(u, _MM_PERM_CDAB));
        const __m128i isum = _mm_add_epi32(_mm512_castsi512_si128(_mm512_maskz_compress_epi32(0x1111, u)),
                                           _mm_loadu_si128((const __m128i *)(corr + b)));
        p = _mm_fmadd_ps(_mm_cvtepi32_ps(isum), _mm_mul_ps(q8g_row_scales4(row, b, nb), _mm_loadu_ps(dx + b)), p);
    }
    return q8g_row_finish(p);
}

#define Q8G_KERNEL(T)                                                                                                  \
    static void q8g_kernel512_##T(const uint8_t *g, const uint8_t *const *xs, int64_t nb, int64_t s0, int64_t s1,      \
                                  float *lanes, bool first, float *y, int64_t n_out, int rows) {                       \
        q8g_spans512(g, xs, T, nb, s0, s1, lanes, first, y, n_out, rows);                                              \
    }
Q8G_KERNEL(1)
Q8G_KERNEL(2)
Q8G_KERNEL(3)
Q8G_KERNEL(4)
#undef Q8G_KERNEL
static const q8g_kernel_fn q8g_kernels512[4] = {q8g_kernel512_1, q8g_kernel512_2, q8g_kernel512_3, q8g_kernel512_4};

/* ---- tile instances and the row loop ---- */

typedef void (*tile_fn)(const uint8_t *const *rows, const float *const *xs, int64_t n, float *out);

#define TILE_INSTANCES(R, T)                                                                                           \
    static void f32_##R##x##T(const uint8_t *const *rows, const float *const *xs, int64_t n, float *out) {             \
        float_tile(load16_f32, ember_weight_f32, rows, xs, R, T, n, out);                                              \
    }                                                                                                                  \
    static void f16_##R##x##T(const uint8_t *const *rows, const float *const *xs, int64_t n, float *out) {             \
        float_tile(load16_f16, ember_weight_f16, rows, xs, R, T, n, out);                                              \
    }                                                                                                                  \
    static void bf16_##R##x##T(const uint8_t *const *rows, const float *const *xs, int64_t n, float *out) {            \
        float_tile(load16_bf16, ember_weight_bf16, rows, xs, R, T, n, out);                                            \
    }
TILE_INSTANCES(4, 4)
TILE_INSTANCES(4, 3)
TILE_INSTANCES(4, 2)
TILE_INSTANCES(4, 1)
TILE_INSTANCES(1, 4)
TILE_INSTANCES(1, 3)
TILE_INSTANCES(1, 2)
TILE_INSTANCES(1, 1)

/* One float type's tiles: [R == 4 ? 0 : 1][T - 1] */
static const tile_fn tiles_f32[2][4] = {{f32_4x1, f32_4x2, f32_4x3, f32_4x4}, {f32_1x1, f32_1x2, f32_1x3, f32_1x4}};
static const tile_fn tiles_f16[2][4] = {{f16_4x1, f16_4x2, f16_4x3, f16_4x4}, {f16_1x1, f16_1x2, f16_1x3, f16_1x4}};
static const tile_fn tiles_bf16[2][4] = {{bf16_4x1, bf16_4x2, bf16_4x3, bf16_4x4},
                                         {bf16_1x1, bf16_1x2, bf16_1x3, bf16_1x4}};

/* The row loop of the float products. A single token reads each weight once: rows go one at a
 * time, in memory order (several rows interleaved are several streams, which the hardware
 * prefetcher follows worse); with several tokens a tile's 4 rows are reused from cache. */
EMBER_AI void float_rows(const tile_fn (*tiles)[4], const ember_matrix *w, const float *x, float *y, int64_t n_tok,
                         int64_t o0, int64_t o1) {
    const int r_main = n_tok == 1 ? 1 : 4;
    for (int64_t o = o0; o < o1;) {
        const int R = o1 - o >= r_main ? r_main : 1;
        const uint8_t *rows[4];
        for (int r = 0; r < R; r++) rows[r] = (const uint8_t *)w->data + (size_t)(o + r) * w->row_bytes;
        for (int64_t t = 0; t < n_tok; t += 4) {
            const int T = n_tok - t >= 4 ? 4 : (int)(n_tok - t);
            const float *xs[4];
            for (int k = 0; k < T; k++) xs[k] = x + (t + k) * w->n_in;
            float out[16];
            tiles[R == 4 ? 0 : 1][T - 1](rows, xs, w->n_in, out);
            for (int r = 0; r < R; r++)
                for (int k = 0; k < T; k++) y[(t + k) * w->n_out + o + r] = out[r * T + k];
        }
        o += R;
    }
}

static void rows_f32(const ember_matrix *w, const float *x, const void *xa, size_t xa_stride, float *y, int64_t n_tok,
                     int64_t o0, int64_t o1) {
    (void)xa, (void)xa_stride;
    float_rows(tiles_f32, w, x, y, n_tok, o0, o1);
}
static void rows_f16(const ember_matrix *w, const float *x, const void *xa, size_t xa_stride, float *y, int64_t n_tok,
                     int64_t o0, int64_t o1) {
    (void)xa, (void)xa_stride;
    float_rows(tiles_f16, w, x, y, n_tok, o0, o1);
}
static void rows_bf16(const ember_matrix *w, const float *x, const void *xa, size_t xa_stride, float *y, int64_t n_tok,
                      int64_t o0, int64_t o1) {
    (void)xa, (void)xa_stride;
    float_rows(tiles_bf16, w, x, y, n_tok, o0, o1);
}

static size_t q8_act_size(int64_t n_in) { return q8g_act_size(n_in); }
static void q8_act_prepare(const float *x, void *xa, int64_t n_in) { q8_prepare(x, xa, n_in); }
/* Q8_1 activations (Q4_1/Q5_1 weights): the Q8_0 quantization, then the sums s_x */
static void q81_act_prepare(const float *x, void *xa, int64_t n_in) {
    q8_prepare(x, xa, n_in);
    qd_q81_sums(x, xa, n_in);
}
static void rows_q8_0(const ember_matrix *w, const float *x, const void *xa, size_t xa_stride, float *y, int64_t n_tok,
                      int64_t o0, int64_t o1) {
    (void)x;
    q8g_rows(q8g_kernels512, 4, q8g_row512, w, xa, xa_stride, y, n_tok, o0, o1);
}

/* ---- f32 vector ops ---- */

EMBER_AI float dot16(const float *a, const float *b, int64_t n) {
    __m512 acc = _mm512_setzero_ps();
    const int64_t n16 = n & ~(int64_t)15;
    for (int64_t i = 0; i < n16; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
    float s = reduce512(acc);
    for (int64_t i = n16; i < n; i++) s = fmaf(a[i], b[i], s);
    return s;
}

static float avx512_dot_f32(const float *a, const float *b, int64_t n) { return dot16(a, b, n); }

/* -x exactly (sign flip; AVX-512F has no float xor without DQ) */
EMBER_AI __m512 neg512(__m512 x) {
    return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000u)));
}

EMBER_AI __m512 exp512(__m512 x) {
    x = _mm512_max_ps(_mm512_set1_ps(EMBER_EXP_LO), x); /* NaN in x passes through (second operand) */
    x = _mm512_min_ps(_mm512_set1_ps(EMBER_EXP_HI), x);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(EMBER_LOG2E)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EMBER_EXP_C1), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EMBER_EXP_C2), r);
    __m512 p = _mm512_set1_ps(EMBER_EXP_P7);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EMBER_EXP_P6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EMBER_EXP_P5));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EMBER_EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EMBER_EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EMBER_EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
}

/* ---- attention over one chunk of cached keys (contract: kernels.h, order: docs/kernels.md) ----
 * Rows are taken 4 at a time: each key vector loaded serves the 4 rows' scores, and each value
 * vector their 4 weighted sums. Every score and every sum element is still its own chain in the
 * common order, so the blocking changes which values are computed together, never a result. */

/* reduce512 of the 16 accumulators a[r][c] at once, lane 4r + c of the result: each step adds the
 * same pairs as the tree of ember_reduce16 (lanes 8, 4, 2 and 1 apart), four or eight accumulators
 * per instruction, so every result is bit for bit its reduce512. */
EMBER_AI __m512 reduce512x16(__m512 a[4][4]) {
    __m512 x[8], y[4], z[2];
    /* v[4c + r] = a[r][c]: step 4 leaves v[4m + k] in lane 4k + m */
#pragma GCC unroll 8
    for (int p = 0; p < 8; p++) { /* lanes l and l + 8 of v[2p], v[2p+1] */
        const __m512 u = a[(2 * p) % 4][(2 * p) / 4], w = a[(2 * p + 1) % 4][(2 * p + 1) / 4];
        x[p] = _mm512_add_ps(_mm512_shuffle_f32x4(u, w, _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_f32x4(u, w, _MM_SHUFFLE(3, 2, 3, 2)));
    }
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++) /* 4 apart: [v4q, v4q+1, v4q+2, v4q+3] one per 128-bit block */
        y[q] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * q], x[2 * q + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(x[2 * q], x[2 * q + 1], _MM_SHUFFLE(3, 1, 3, 1)));
#pragma GCC unroll 2
    for (int r = 0; r < 2; r++) /* 2 apart, within each block */
        z[r] = _mm512_add_ps(_mm512_shuffle_ps(y[2 * r], y[2 * r + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(y[2 * r], y[2 * r + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm512_add_ps(_mm512_shuffle_ps(z[0], z[1], _MM_SHUFFLE(2, 0, 2, 0)), /* 1 apart */
                         _mm512_shuffle_ps(z[0], z[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/* Scores of R rows with 4 keys at once: R x 4 independent chains, each in the common reduction
 * order; the keys are `stride` bytes apart. out[r][c] = q[r] . key c (unscaled). */
EMBER_AI void kdot_rx4(load16_fn load, load1_fn load1, int R, const float *const *q, const uint8_t *k, size_t stride,
                       int64_t n, float *const *out) {
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) acc[r][c] = _mm512_setzero_ps();
    const int64_t n16 = n & ~(int64_t)15;
    for (int64_t i = 0; i < n16; i += 16) {
        __m512 kv[4];
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) kv[c] = load(k + c * stride, i);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const __m512 qv = _mm512_loadu_ps(q[r] + i);
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) acc[r][c] = _mm512_fmadd_ps(qv, kv[c], acc[r][c]);
        }
    }
    if (R == 4 && n16 == n) { /* the 16 trees at once */
        float s[16];
        _mm512_storeu_ps(s, reduce512x16(acc));
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) out[r][c] = s[4 * r + c];
        return;
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            float s = reduce512(acc[r][c]);
            for (int64_t i = n16; i < n; i++) s = fmaf(q[r][i], load1(k + c * stride, i), s);
            out[r][c] = s;
        }
}

EMBER_AI float kdot(load16_fn load, load1_fn load1, const float *q, const uint8_t *k, int64_t n) {
    __m512 acc = _mm512_setzero_ps();
    const int64_t n16 = n & ~(int64_t)15;
    for (int64_t i = 0; i < n16; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), load(k, i), acc);
    float s = reduce512(acc);
    for (int64_t i = n16; i < n; i++) s = fmaf(q[i], load1(k, i), s);
    return s;
}

/* The R rows' sums acc_r[d] = sum over visible j of e_r[j] v_j[d] (fused, in j order from +0) for
 * d in [d0, d0 + 16*C); keys [0, n) relative to the block's first key, row r sees [lo[r], hi[r]). */
EMBER_AI void acc_rows(load16_fn load, int R, int C, const uint8_t *v, size_t stride, int64_t n, int64_t d0,
                       float *const *e, const int64_t *lo, const int64_t *hi, float *const *out) {
    __m512 o[4][8];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) o[r][c] = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j++) {
        const uint8_t *vj = v + (size_t)j * stride;
        __m512 vv[8];
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) vv[c] = load(vj, d0 + 16 * c);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            if (j < lo[r] || j >= hi[r]) continue;
            const __m512 p = _mm512_set1_ps(e[r][j]);
#pragma GCC unroll 8
            for (int c = 0; c < C; c++) o[r][c] = _mm512_fmadd_ps(p, vv[c], o[r][c]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) _mm512_storeu_ps(out[r] + d0 + 16 * c, o[r][c]);
}

/* One block of R <= 4 rows (R a constant at each call). */
EMBER_AI void chunk_block(load16_fn load, load1_fn load1, size_t esize, int R, const ember_attn_rows *a, int r0,
                          int64_t k0, int64_t k1, float *scores, float *m, float *l, float *acc) {
    const int64_t hd = a->hd;
    const size_t stride = (size_t)a->kv_stride * esize;
    int64_t lo[4], hi[4], ulo = k1, uhi = k0;
    for (int r = 0; r < R; r++) {
        lo[r] = a->lo[r0 + r] > k0 ? a->lo[r0 + r] : k0;
        hi[r] = a->hi[r0 + r] < k1 ? a->hi[r0 + r] : k1;
        if (hi[r] <= lo[r]) {
            m[r0 + r] = -INFINITY;
            lo[r] = hi[r] = 0; /* sees nothing below */
            continue;
        }
        if (lo[r] < ulo) ulo = lo[r];
        if (hi[r] > uhi) uhi = hi[r];
    }
    if (uhi <= ulo) return;
    const int64_t n = uhi - ulo;
    const uint8_t *k = (const uint8_t *)a->k + (size_t)ulo * stride, *v = (const uint8_t *)a->v + (size_t)ulo * stride;
    float *e[4], *out[4];
    const float *q[4];
    for (int r = 0; r < R; r++) {
        e[r] = scores + (size_t)(r0 + r) * EMBER_ATTN_CHUNK; /* e[r][j - ulo] */
        out[r] = acc + (size_t)(r0 + r) * hd;
        q[r] = a->q[r0 + r];
        if (hi[r] > lo[r]) lo[r] -= ulo, hi[r] -= ulo;
    }
    /* scores over the rows' union of keys (a row ignores those it does not see) */
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) {
        float *o[4];
        for (int r = 0; r < R; r++) o[r] = e[r] + j;
        kdot_rx4(load, load1, R, q, k + (size_t)j * stride, stride, hd, o);
        for (int r = 0; r < R; r++)
            for (int c = 0; c < 4; c++) e[r][j + c] *= a->scale;
    }
    for (; j < n; j++)
        for (int r = 0; r < R; r++) e[r][j] = kdot(load, load1, q[r], k + (size_t)j * stride, hd) * a->scale;
    if (a->softcap > 0.0f) /* Gemma 2's attention logit softcap: libm tanhf, as on every set */
        for (int r = 0; r < R; r++) ember_attn_softcap(e[r], n, a->softcap);
    /* per row: e_j = exp(s_j - max) over its keys; their sum in the common order */
    for (int r = 0; r < R; r++) {
        const int64_t nr = hi[r] - lo[r];
        if (nr <= 0) continue;
        float *er = e[r] + lo[r], mx = ember_max_row(er, nr);
        const __m512 vmx = _mm512_set1_ps(mx);
        const int64_t n16 = nr & ~(int64_t)15;
        __m512 vs = _mm512_setzero_ps();
        for (j = 0; j < n16; j += 16) {
            const __m512 x = exp512(_mm512_sub_ps(_mm512_loadu_ps(er + j), vmx));
            _mm512_storeu_ps(er + j, x);
            vs = _mm512_add_ps(vs, x);
        }
        float sum = reduce512(vs);
        for (j = n16; j < nr; j++) {
            er[j] = ember_s_exp(er[j] - mx);
            sum += er[j];
        }
        m[r0 + r] = ember_attn_partial_max(mx, sum);
        l[r0 + r] = sum;
    }
    /* the weighted sums: value vectors loaded once for the block's rows */
    const int64_t h16 = hd & ~(int64_t)15;
    const int C = R > 2 ? 4 : 8;
    int64_t d = 0;
    for (; d + 16 * C <= h16; d += 16 * C) acc_rows(load, R, C, v, stride, n, d, e, lo, hi, out);
    for (; d < h16; d += 16) acc_rows(load, R, 1, v, stride, n, d, e, lo, hi, out);
    for (; d < hd; d++)
        for (int r = 0; r < R; r++) {
            if (hi[r] <= lo[r]) continue;
            float o = 0.0f;
            for (j = lo[r]; j < hi[r]; j++) o = fmaf(e[r][j], load1(v + (size_t)j * stride, d), o);
            out[r][d] = o;
        }
}

EMBER_AI void chunk_rows(load16_fn load, load1_fn load1, size_t esize, const ember_attn_rows *a, int64_t k0, int64_t k1,
                         float *scores, float *m, float *l, float *acc) {
    int r0 = 0;
    for (; r0 + 4 <= a->n_rows; r0 += 4) chunk_block(load, load1, esize, 4, a, r0, k0, k1, scores, m, l, acc);
    if (a->n_rows - r0 >= 2) {
        chunk_block(load, load1, esize, 2, a, r0, k0, k1, scores, m, l, acc);
        r0 += 2;
    }
    if (r0 < a->n_rows) chunk_block(load, load1, esize, 1, a, r0, k0, k1, scores, m, l, acc);
}

static void avx512_attn_chunk(const ember_attn_rows *a, int64_t k0, int64_t k1, float *scores, float *m, float *l,
                              float *acc) {
    switch (a->kv_type) {
    case EMBER_TYPE_F16: chunk_rows(load16_f16, ember_weight_f16, 2, a, k0, k1, scores, m, l, acc); break;
    case EMBER_TYPE_BF16: chunk_rows(load16_bf16, ember_weight_bf16, 2, a, k0, k1, scores, m, l, acc); break;
    default: chunk_rows(load16_f32, ember_weight_f32, 4, a, k0, k1, scores, m, l, acc); break;
    }
}

static void avx512_rmsnorm(float *y, const float *x, const float *w, int64_t n, float eps) {
    const float ss = dot16(x, x, n);
    const float scale = 1.0f / sqrtf(ss / (float)n + eps);
    const __m512 vs = _mm512_set1_ps(scale);
    const int64_t n16 = n & ~(int64_t)15;
    for (int64_t i = 0; i < n16; i += 16) {
        __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + i), vs);
        if (w) v = _mm512_mul_ps(v, _mm512_loadu_ps(w + i));
        _mm512_storeu_ps(y + i, v);
    }
    for (int64_t i = n16; i < n; i++) y[i] = w ? (x[i] * scale) * w[i] : x[i] * scale;
}

static void avx512_silu_mul(float *g, const float *u, int64_t n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    const int64_t n16 = n & ~(int64_t)15;
    for (int64_t i = 0; i < n16; i += 16) {
        __m512 x = _mm512_loadu_ps(g + i);
        __m512 s = _mm512_div_ps(x, _mm512_add_ps(one, exp512(neg512(x)))); /* exp(-x) */
        _mm512_storeu_ps(g + i, _mm512_mul_ps(s, _mm512_loadu_ps(u + i)));
    }
    for (int64_t i = n16; i < n; i++) g[i] = ember_s_silu(g[i]) * u[i];
}

/* x / (1 + exp(-2u)), as ember_s_gelu */
EMBER_AI __m512 gelu512(__m512 x) {
    __m512 a = _mm512_mul_ps(_mm512_set1_ps(EMBER_GELU_A), x);
    a = _mm512_mul_ps(a, x);
    a = _mm512_mul_ps(a, x);
    __m512 u = _mm512_mul_ps(_mm512_set1_ps(EMBER_GELU_K), _mm512_add_ps(x, a));
    return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), exp512(neg512(_mm512_add_ps(u, u)))));
}

static void avx512_gelu_mul(float *g, const float *u, int64_t n) {
    const int64_t n16 = n & ~(int64_t)15;
    for (int64_t i = 0; i < n16; i += 16) {
        __m512 r = gelu512(_mm512_loadu_ps(g + i));
        if (u) r = _mm512_mul_ps(r, _mm512_loadu_ps(u + i));
        _mm512_storeu_ps(g + i, r);
    }
    for (int64_t i = n16; i < n; i++) g[i] = u ? ember_s_gelu(g[i]) * u[i] : ember_s_gelu(g[i]);
}

const ember_kernel_ops ember_kernels_avx512 = {
    .name = "avx512",
    .mm =
        {
            [EMBER_TYPE_F32] = {.rows = rows_f32},
            [EMBER_TYPE_F16] = {.rows = rows_f16},
            [EMBER_TYPE_BF16] = {.rows = rows_bf16},
            [EMBER_TYPE_Q8_0] = {.act_size = q8_act_size,
                                 .act_prepare = q8_act_prepare,
                                 .rows = rows_q8_0,
                                 .pack_size = q8g_pack_size,
                                 .pack = q8g_pack},
            /* the 4- to 6-bit types (quant_dots.h); Q2_K/Q3_K: the reference product */
            QD_MM_ENTRIES(q8_act_size, q8_act_prepare, q81_act_prepare),
        },
    .dot_f32 = avx512_dot_f32,
    .mm_t = {TS_MM_T_ENTRIES},
    .attn_chunk = avx512_attn_chunk,
    .rmsnorm = avx512_rmsnorm,
    .layernorm = ember_layernorm,
    .silu_mul = avx512_silu_mul,
    .gelu_mul = avx512_gelu_mul,
    .gelu_mul_ref = ember_gelu_mul_ref,
    .rope_heads = ember_rope_heads_fast,
    .get_row = ember_matrix_get_row,
    .f32_to_f16_row = ember_half_f16_row,
    .f32_to_bf16_row = ember_half_bf16_row,
};
