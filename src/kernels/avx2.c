/* avx2.c — the AVX2 kernel set (AVX2 + FMA + F16C), compiled with its own flags and called only
 * after dispatch.c has checked CPUID and XCR0. It reproduces avx512.c bit for bit: every 16-lane
 * accumulator of the common order (simd_common.h) is a pair of 8-lane registers here.
 *
 * Matrix products are register-tiled (2 rows x 2 tokens, or 4 rows for a single token); AVX2's 16
 * registers hold 8 accumulator pairs at most. */
#include "half_convert.h"
#include "q8_groups.h"
#include "quant_dots.h"
#include "transposed_simd.h"

#include <stdlib.h>

/* ---- the fast Q8_0 transposed product (transposed_q8.h): the integer dot of one block ---- */

#define TQ_FLIP 0
/* |q| (u8) times hq carrying q's sign (s8), in pairs (2 * 128 * 127 < 2^15: no saturation), then
 * the pairs summed into one int32 lane per column. */
static inline void tq_isums(const uint8_t *p, int64_t ps, const int8_t *hq, int64_t nq, int32_t hsum, int32_t *out) {
    (void)hsum;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc[4];
    for (int k = 0; k < 4; k++) acc[k] = _mm256_setzero_si256();
    for (int64_t r4 = 0; r4 < nq; r4++) {
        int32_t quad;
        memcpy(&quad, hq + 4 * r4, 4);
        const __m256i hb = _mm256_set1_epi32(quad);
        for (int k = 0; k < 4; k++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(p + r4 * ps + 32 * k));
            const __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(q), _mm256_sign_epi8(hb, q));
            acc[k] = _mm256_add_epi32(acc[k], _mm256_madd_epi16(pairs, ones));
        }
    }
    for (int k = 0; k < 4; k++) _mm256_storeu_si256((__m256i *)(out + 8 * k), acc[k]);
}
#include "transposed_q8.h"

/* ---- f32 / f16 / bf16 weights: f32 activations ---- */

/* The 8-wide loaders of the float types (exact conversions to f32). */
static inline __m256 load8_f32(const uint8_t *row, int64_t i) { return _mm256_loadu_ps((const float *)(row + 4 * i)); }
static inline __m256 load8_f16(const uint8_t *row, int64_t i) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 2 * i)));
}
static inline __m256 load8_bf16(const uint8_t *row, int64_t i) { /* bf16: the high half of an f32 */
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(row + 2 * i))), 16));
}
typedef __m256 (*load8_fn)(const uint8_t *row, int64_t i);
typedef float (*load1_fn)(const uint8_t *row, int64_t i);

/* out[r*T + t] = row r . token t over n values, in the common order; load/load1 are the type's
 * loaders (constants at every call, so each instance is compiled for its type). */
EMBER_AI void float_tile(load8_fn load, load1_fn load1, const uint8_t *const *rows, const float *const *xs, int R,
                         int T, int64_t n, float *out) {
    __m256 acc[4][2][2]; /* [row][token][lanes 0-7 | 8-15] */
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int t = 0; t < T; t++) acc[r][t][0] = acc[r][t][1] = _mm256_setzero_ps();
    const int64_t n16 = n & ~(int64_t)15;
    for (int64_t i = 0; i < n16; i += 16) {
        __m256 xv[2][2];
#pragma GCC unroll 2
        for (int t = 0; t < T; t++) {
            xv[t][0] = _mm256_loadu_ps(xs[t] + i);
            xv[t][1] = _mm256_loadu_ps(xs[t] + i + 8);
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m256 w0 = load(rows[r], i), w1 = load(rows[r], i + 8);
#pragma GCC unroll 2
            for (int t = 0; t < T; t++) {
                acc[r][t][0] = _mm256_fmadd_ps(w0, xv[t][0], acc[r][t][0]);
                acc[r][t][1] = _mm256_fmadd_ps(w1, xv[t][1], acc[r][t][1]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int t = 0; t < T; t++) {
            float s = ember_reduce16(acc[r][t][0], acc[r][t][1]);
            for (int64_t i = n16; i < n; i++) s = fmaf(load1(rows[r], i), xs[t][i], s);
            out[r * T + t] = s;
        }
}

/* ---- q8_0 weights x q8_0-quantized activations (q8_groups.h: layouts and order) ----
 * maddubs multiplies unsigned by signed bytes: |w| (abs of -128 is 128 as u8) times q signed by
 * w's sign (|q| <= 127, so never overflows); each 16-bit pair sum is at most 2*128*127 = 32512, so
 * it never saturates. madd with ones then gives 4 products per int32 lane, and 8 steps give each
 * lane the exact sum w q of its (row, block), the integer avx512.c gets from vpdpbusd. The
 * repacked weights are u8 = w + 128; xor 0x80 gives w back. */

/* Quantizes one token (ember_quantize_row_q8_0's scheme, bit for bit) into the prepared layout. */
static void q8_prepare(const float *x, uint8_t *xa, int64_t n_in) {
    const int64_t nb = n_in / EMBER_QK8_0;
    const __m256 sign = _mm256_set1_ps(-0.0f), inf = _mm256_set1_ps(INFINITY);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t b = 0; b < nb; b++) {
        const float *xb = x + b * EMBER_QK8_0;
        __m256 v[4], mx = _mm256_setzero_ps();
        int bad = 0;
        for (int k = 0; k < 4; k++) {
            v[k] = _mm256_loadu_ps(xb + 8 * k);
            __m256 a = _mm256_andnot_ps(sign, v[k]);
            bad |= _mm256_movemask_ps(_mm256_cmp_ps(a, inf, _CMP_NLT_UQ));
            mx = _mm256_max_ps(mx, a);
        }
        int8_t q[32];
        if (bad) { /* NaN or infinity in the block: d = NaN, quants 0 (as ember_quantize_row_q8_0) */
            memset(q, 0, sizeof q);
            q8g_act_block(xa, nb, b, q, ember_h2f(0x7e00));
            continue;
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4); /* max is exact in any order */
        const uint16_t d16 = _cvtss_sh(amax / 127.0f, _MM_FROUND_TO_NEAREST_INT);
        const __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
        __m256i i[4];
        for (int k = 0; k < 4; k++) /* round half to even, then exact conversion; |values| <= 127 */
            i[k] = _mm256_cvttps_epi32(
                _mm256_round_ps(_mm256_mul_ps(v[k], id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        /* int32 -> int8 with saturating packs; the packs work per 128-bit half, perm restores order */
        __m256i p16a = _mm256_packs_epi32(i[0], i[1]), p16b = _mm256_packs_epi32(i[2], i[3]);
        _mm256_storeu_si256((__m256i *)q, _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b), perm));
        q8g_act_block(xa, nb, b, q, ember_h2f(d16));
    }
    q8g_act_pad(xa, nb);
}

/* Spans [s0, s1) of one 4-row group times T <= 2 tokens (q8g_kernel_fn): a 64-byte step is two
 * registers, rows 0-1 (lanes 0-7) and rows 2-3 (lanes 8-15). */
EMBER_AI void q8g_spans256(const uint8_t *g, const uint8_t *const *xs, int T, int64_t nb, int64_t s0, int64_t s1,
                           float *lanes, bool first, float *y, int64_t n_out, int rows) {
    const size_t odx = q8g_off_dx(nb);
    const __m256i ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8((char)0x80);
    __m256 acc[2][2];
#pragma GCC unroll 2
    for (int t = 0; t < T; t++) {
        acc[t][0] = first ? _mm256_setzero_ps() : _mm256_load_ps(lanes + 16 * t);
        acc[t][1] = first ? _mm256_setzero_ps() : _mm256_load_ps(lanes + 16 * t + 8);
    }
    for (int64_t s = s0; s < s1; s++, g += Q8G_SPAN_BYTES) {
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const int64_t quad = 2 * s + h;
            const __m256 dw0 = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(g + 32 * h)));
            const __m256 dw1 = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(g + 32 * h + 16)));
            __m256i is[2][2];
#pragma GCC unroll 2
            for (int t = 0; t < T; t++) is[t][0] = is[t][1] = _mm256_setzero_si256();
            const uint8_t *wq = g + 64 + 512 * h;
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) {
                const __m256i w0 = _mm256_xor_si256(_mm256_load_si256((const __m256i *)(wq + 64 * k)), flip);
                const __m256i w1 = _mm256_xor_si256(_mm256_load_si256((const __m256i *)(wq + 64 * k + 32)), flip);
                const __m256i a0 = _mm256_abs_epi8(w0), a1 = _mm256_abs_epi8(w1);
#pragma GCC unroll 2
                for (int t = 0; t < T; t++) {
                    const __m256i q =
                        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(xs[t] + 128 * quad + 16 * k)));
                    is[t][0] = _mm256_add_epi32(
                        is[t][0], _mm256_madd_epi16(_mm256_maddubs_epi16(a0, _mm256_sign_epi8(q, w0)), ones));
                    is[t][1] = _mm256_add_epi32(
                        is[t][1], _mm256_madd_epi16(_mm256_maddubs_epi16(a1, _mm256_sign_epi8(q, w1)), ones));
                    ember_pin256(&is[t][0]), ember_pin256(&is[t][1]);
                }
            }
#pragma GCC unroll 2
            for (int t = 0; t < T; t++) {
                const __m256 dx = _mm256_broadcast_ps((const __m128 *)((const float *)(xs[t] + odx) + 4 * quad));
                acc[t][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[t][0]), _mm256_mul_ps(dw0, dx), acc[t][0]);
                acc[t][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[t][1]), _mm256_mul_ps(dw1, dx), acc[t][1]);
            }
        }
    }
    if (!y) {
#pragma GCC unroll 2
        for (int t = 0; t < T; t++) {
            _mm256_store_ps(lanes + 16 * t, acc[t][0]);
            _mm256_store_ps(lanes + 16 * t + 8, acc[t][1]);
        }
        return;
    }
    /* (p0 + p1) + (p2 + p3) in every 128-bit lane (one row each), as avx512.c */
#pragma GCC unroll 2
    for (int t = 0; t < T; t++) {
        float out[4];
        for (int hh = 0; hh < 2; hh++) {
            const __m256 pairs = _mm256_add_ps(acc[t][hh], _mm256_permute_ps(acc[t][hh], 0xB1));
            const __m256 sums = _mm256_add_ps(pairs, _mm256_permute_ps(pairs, 0x4E));
            out[2 * hh] = _mm256_cvtss_f32(sums);
            out[2 * hh + 1] = _mm_cvtss_f32(_mm256_extractf128_ps(sums, 1));
        }
        for (int r = 0; r < rows; r++) y[t * n_out + r] = out[r];
    }
}

/* One file-layout row times one token (q8g_row_fn), for decoding with weights read in place: per
 * block the maddubs/madd lanes, three horizontal adds to the 4 block sums of a quad (exact
 * integers), then one conversion and one fused multiply-add per block into p[b % 4]. */
static float q8g_row256(const uint8_t *row, const uint8_t *xa, int64_t nb) {
    const __m256i ones = _mm256_set1_epi16(1);
    const uint8_t *plain = xa + q8g_off_plain(nb);
    const float *dx = (const float *)(xa + q8g_off_dx(nb));
    __m128 p = _mm_setzero_ps();
    for (int64_t b = 0; b < nb; b += 4) {
        __m256i lanes[4];
        for (int j = 0; j < 4; j++) {
            if (b + j >= nb) { /* padding: weight 0 */
                lanes[j] = _mm256_setzero_si256();
                continue;
            }
            const uint8_t *blk = row + (b + j) * sizeof(ember_block_q8_0);
            const __m256i w = _mm256_loadu_si256((const __m256i *)(blk + 2));
            const __m256i q = _mm256_loadu_si256((const __m256i *)(plain + 32 * (b + j)));
            lanes[j] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(q, w)), ones);
        }
        const __m256i h =
            _mm256_hadd_epi32(_mm256_hadd_epi32(lanes[0], lanes[1]), _mm256_hadd_epi32(lanes[2], lanes[3]));
        const __m128i isum = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
        p = _mm_fmadd_ps(_mm_cvtepi32_ps(isum), _mm_mul_ps(q8g_row_scales4(row, b, nb), _mm_loadu_ps(dx + b)), p);
    }
    return q8g_row_finish(p);
}

static void q8g_kernel256_1(const uint8_t *g, const uint8_t *const *xs, int64_t nb, int64_t s0, int64_t s1,
                            float *lanes, bool first, float *y, int64_t n_out, int rows) {
    q8g_spans256(g, xs, 1, nb, s0, s1, lanes, first, y, n_out, rows);
}
static void q8g_kernel256_2(const uint8_t *g, const uint8_t *const *xs, int64_t nb, int64_t s0, int64_t s1,
                            float *lanes, bool first, float *y, int64_t n_out, int rows) {
    q8g_spans256(g, xs, 2, nb, s0, s1, lanes, first, y, n_out, rows);
}
static const q8g_kernel_fn q8g_kernels256[2] = {q8g_kernel256_1, q8g_kernel256_2};

/* ---- tile instances and the row loop ---- */

typedef void (*tile_fn)(const uint8_t *const *rows, const float *const *xs, int64_t n, float *out);

#define TILE_INSTANCES(R, T)                                                                                           \
    static void f32_##R##x##T(const uint8_t *const *rows, const float *const *xs, int64_t n, float *out) {             \
        float_tile(load8_f32, ember_weight_f32, rows, xs, R, T, n, out);                                               \
    }                                                                                                                  \
    static void f16_##R##x##T(const uint8_t *const *rows, const float *const *xs, int64_t n, float *out) {             \
        float_tile(load8_f16, ember_weight_f16, rows, xs, R, T, n, out);                                               \
    }                                                                                                                  \
    static void bf16_##R##x##T(const uint8_t *const *rows, const float *const *xs, int64_t n, float *out) {            \
        float_tile(load8_bf16, ember_weight_bf16, rows, xs, R, T, n, out);                                             \
    }
TILE_INSTANCES(4, 1)
TILE_INSTANCES(2, 2)
TILE_INSTANCES(2, 1)
TILE_INSTANCES(1, 2)
TILE_INSTANCES(1, 1)

/* One float type's tiles by shape: 0 = 4x1, 1 = 2x2, 2 = 2x1, 3 = 1x2, 4 = 1x1 */
static const tile_fn tiles_f32[5] = {f32_4x1, f32_2x2, f32_2x1, f32_1x2, f32_1x1};
static const tile_fn tiles_f16[5] = {f16_4x1, f16_2x2, f16_2x1, f16_1x2, f16_1x1};
static const tile_fn tiles_bf16[5] = {bf16_4x1, bf16_2x2, bf16_2x1, bf16_1x2, bf16_1x1};

/* The row loop of the float products: 4 rows x 1 token for a single token, else 2 x 2 tiles. */
EMBER_AI void float_rows(const tile_fn *tiles, const ember_matrix *w, const float *x, float *y, int64_t n_tok,
                         int64_t o0, int64_t o1) {
    const int r_main = n_tok == 1 ? 4 : 2;
    for (int64_t o = o0; o < o1;) {
        const int R = o1 - o >= r_main ? r_main : o1 - o >= 2 && r_main == 2 ? 2 : 1;
        const uint8_t *rows[4];
        for (int r = 0; r < R; r++) rows[r] = (const uint8_t *)w->data + (size_t)(o + r) * w->row_bytes;
        for (int64_t t = 0; t < n_tok; t += 2) {
            const int T = R == 4 ? 1 : n_tok - t >= 2 ? 2 : 1;
            const float *xs[2];
            for (int k = 0; k < T; k++) xs[k] = x + (t + k) * w->n_in;
            const int shape = R == 4 ? 0 : R == 2 ? (T == 2 ? 1 : 2) : (T == 2 ? 3 : 4);
            float out[4];
            tiles[shape](rows, xs, w->n_in, out);
            for (int r = 0; r < R; r++)
                for (int k = 0; k < T; k++) y[(t + k) * w->n_out + o + r] = out[r * T + k];
            if (R == 4) break; /* single token */
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
    q8g_rows(q8g_kernels256, 2, q8g_row256, w, xa, xa_stride, y, n_tok, o0, o1);
}

/* ---- f32 vector ops ---- */

EMBER_AI float dot16(const float *a, const float *b, int64_t n) {
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    const int64_t n16 = n & ~(int64_t)15;
    for (int64_t i = 0; i < n16; i += 16) {
        lo = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), lo);
        hi = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), hi);
    }
    float s = ember_reduce16(lo, hi);
    for (int64_t i = n16; i < n; i++) s = fmaf(a[i], b[i], s);
    return s;
}

static float avx2_dot_f32(const float *a, const float *b, int64_t n) { return dot16(a, b, n); }

EMBER_AI __m256 exp256(__m256 x) {
    x = _mm256_max_ps(_mm256_set1_ps(EMBER_EXP_LO), x); /* NaN in x passes through (second operand) */
    x = _mm256_min_ps(_mm256_set1_ps(EMBER_EXP_HI), x);
    __m256 n =
        _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(EMBER_LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EMBER_EXP_C1), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EMBER_EXP_C2), r);
    __m256 p = _mm256_set1_ps(EMBER_EXP_P7);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EMBER_EXP_P6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EMBER_EXP_P5));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EMBER_EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EMBER_EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EMBER_EXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

/* ---- attention over one chunk of cached keys (contract: kernels.h, order: docs/kernels.md) ----
 * Rows are taken 2 at a time (16 registers: 2 rows x 2 keys x 2 halves of accumulators, plus the
 * loads): each key or value vector loaded serves both rows. Every score and every sum element is
 * still its own chain in the common order, so the result equals avx512.c's bit for bit. */

/* Scores of R <= 2 rows with 2 keys at once, each in the common order (lanes 0-7 and 8-15 in two
 * registers). out[r][c] = q[r] . key c (unscaled). */
EMBER_AI void kdot_rx2(load8_fn load, load1_fn load1, int R, const float *const *q, const uint8_t *k, size_t stride,
                       int64_t n, float *const *out) {
    __m256 lo[2][2], hi[2][2];
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int c = 0; c < 2; c++) lo[r][c] = hi[r][c] = _mm256_setzero_ps();
    const int64_t n16 = n & ~(int64_t)15;
    for (int64_t i = 0; i < n16; i += 16) {
        __m256 k0[2], k1[2];
#pragma GCC unroll 2
        for (int c = 0; c < 2; c++) k0[c] = load(k + c * stride, i), k1[c] = load(k + c * stride, i + 8);
#pragma GCC unroll 2
        for (int r = 0; r < R; r++) {
            const __m256 q0 = _mm256_loadu_ps(q[r] + i), q1 = _mm256_loadu_ps(q[r] + i + 8);
#pragma GCC unroll 2
            for (int c = 0; c < 2; c++) {
                lo[r][c] = _mm256_fmadd_ps(q0, k0[c], lo[r][c]);
                hi[r][c] = _mm256_fmadd_ps(q1, k1[c], hi[r][c]);
            }
        }
    }
    if (R == 2 && n16 == n) { /* the 4 trees at once: the same pairs as ember_reduce16 */
        __m256 b[4];
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) b[i] = _mm256_add_ps(lo[i / 2][i % 2], hi[i / 2][i % 2]); /* 8 apart */
        const __m256 x0 =
            _mm256_add_ps(_mm256_permute2f128_ps(b[0], b[1], 0x20), _mm256_permute2f128_ps(b[0], b[1], 0x31));
        const __m256 x1 =
            _mm256_add_ps(_mm256_permute2f128_ps(b[2], b[3], 0x20), _mm256_permute2f128_ps(b[2], b[3], 0x31));
        /* 4 apart: x0 = [c0 | c1], x1 = [c2 | c3]; 2 apart: z = [d0 d0' d2 d2' | d1 d1' d3 d3'] */
        const __m256 z = _mm256_add_ps(_mm256_shuffle_ps(x0, x1, _MM_SHUFFLE(1, 0, 1, 0)),
                                       _mm256_shuffle_ps(x0, x1, _MM_SHUFFLE(3, 2, 3, 2)));
        const __m256 e = _mm256_add_ps(_mm256_shuffle_ps(z, z, _MM_SHUFFLE(2, 0, 2, 0)), /* 1 apart */
                                       _mm256_shuffle_ps(z, z, _MM_SHUFFLE(3, 1, 3, 1)));
        float t[8];
        _mm256_storeu_ps(t, e); /* [s0 s2 s0 s2 | s1 s3 s1 s3], s_i of b[i] = row i / 2, key i % 2 */
        out[0][0] = t[0], out[0][1] = t[4], out[1][0] = t[1], out[1][1] = t[5];
        return;
    }
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int c = 0; c < 2; c++) {
            float s = ember_reduce16(lo[r][c], hi[r][c]);
            for (int64_t i = n16; i < n; i++) s = fmaf(q[r][i], load1(k + c * stride, i), s);
            out[r][c] = s;
        }
}

EMBER_AI float kdot(load8_fn load, load1_fn load1, const float *q, const uint8_t *k, int64_t n) {
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    const int64_t n16 = n & ~(int64_t)15;
    for (int64_t i = 0; i < n16; i += 16) {
        lo = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load(k, i), lo);
        hi = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), load(k, i + 8), hi);
    }
    float s = ember_reduce16(lo, hi);
    for (int64_t i = n16; i < n; i++) s = fmaf(q[i], load1(k, i), s);
    return s;
}

/* The R rows' sums acc_r[d] = sum over visible j of e_r[j] v_j[d] (fused, in j order from +0) for
 * d in [d0, d0 + 8*C); row r sees keys [lo[r], hi[r]) of [0, n). */
EMBER_AI void acc_rows(load8_fn load, int R, int C, const uint8_t *v, size_t stride, int64_t n, int64_t d0,
                       float *const *e, const int64_t *lo, const int64_t *hi, float *const *out) {
    __m256 o[2][6];
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 6
        for (int c = 0; c < C; c++) o[r][c] = _mm256_setzero_ps();
    for (int64_t j = 0; j < n; j++) {
        const uint8_t *vj = v + (size_t)j * stride;
        __m256 vv[6];
#pragma GCC unroll 6
        for (int c = 0; c < C; c++) vv[c] = load(vj, d0 + 8 * c);
#pragma GCC unroll 2
        for (int r = 0; r < R; r++) {
            if (j < lo[r] || j >= hi[r]) continue;
            const __m256 p = _mm256_set1_ps(e[r][j]);
#pragma GCC unroll 6
            for (int c = 0; c < C; c++) o[r][c] = _mm256_fmadd_ps(p, vv[c], o[r][c]);
        }
    }
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 6
        for (int c = 0; c < C; c++) _mm256_storeu_ps(out[r] + d0 + 8 * c, o[r][c]);
}

/* One block of R <= 2 rows (R a constant at each call). */
EMBER_AI void chunk_block(load8_fn load, load1_fn load1, size_t esize, int R, const ember_attn_rows *a, int r0,
                          int64_t k0, int64_t k1, float *scores, float *m, float *l, float *acc) {
    const int64_t hd = a->hd;
    const size_t stride = (size_t)a->kv_stride * esize;
    int64_t lo[2], hi[2], ulo = k1, uhi = k0;
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
    float *e[2], *out[2];
    const float *q[2];
    for (int r = 0; r < R; r++) {
        e[r] = scores + (size_t)(r0 + r) * EMBER_ATTN_CHUNK; /* e[r][j - ulo] */
        out[r] = acc + (size_t)(r0 + r) * hd;
        q[r] = a->q[r0 + r];
        if (hi[r] > lo[r]) lo[r] -= ulo, hi[r] -= ulo;
    }
    /* scores over the rows' union of keys (a row ignores those it does not see) */
    int64_t j = 0;
    for (; j + 2 <= n; j += 2) {
        float *o[2];
        for (int r = 0; r < R; r++) o[r] = e[r] + j;
        kdot_rx2(load, load1, R, q, k + (size_t)j * stride, stride, hd, o);
        for (int r = 0; r < R; r++)
            for (int c = 0; c < 2; c++) e[r][j + c] *= a->scale;
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
        const __m256 vmx = _mm256_set1_ps(mx);
        const int64_t n16 = nr & ~(int64_t)15;
        __m256 slo = _mm256_setzero_ps(), shi = _mm256_setzero_ps();
        for (j = 0; j < n16; j += 16) {
            const __m256 x0 = exp256(_mm256_sub_ps(_mm256_loadu_ps(er + j), vmx));
            const __m256 x1 = exp256(_mm256_sub_ps(_mm256_loadu_ps(er + j + 8), vmx));
            _mm256_storeu_ps(er + j, x0);
            _mm256_storeu_ps(er + j + 8, x1);
            slo = _mm256_add_ps(slo, x0);
            shi = _mm256_add_ps(shi, x1);
        }
        float sum = ember_reduce16(slo, shi);
        for (j = n16; j < nr; j++) {
            er[j] = ember_s_exp(er[j] - mx);
            sum += er[j];
        }
        m[r0 + r] = ember_attn_partial_max(mx, sum);
        l[r0 + r] = sum;
    }
    /* the weighted sums: value vectors loaded once for the block's rows */
    const int64_t h8 = hd & ~(int64_t)7;
    const int C = 6; /* 2 rows x 6 accumulators + 6 loaded vectors */
    int64_t d = 0;
    for (; d + 8 * C <= h8; d += 8 * C) acc_rows(load, R, C, v, stride, n, d, e, lo, hi, out);
    for (; d < h8; d += 8) acc_rows(load, R, 1, v, stride, n, d, e, lo, hi, out);
    for (; d < hd; d++)
        for (int r = 0; r < R; r++) {
            if (hi[r] <= lo[r]) continue;
            float o = 0.0f;
            for (j = lo[r]; j < hi[r]; j++) o = fmaf(e[r][j], load1(v + (size_t)j * stride, d), o);
            out[r][d] = o;
        }
}

EMBER_AI void chunk_rows(load8_fn load, load1_fn load1, size_t esize, const ember_attn_rows *a, int64_t k0, int64_t k1,
                         float *scores, float *m, float *l, float *acc) {
    int r0 = 0;
    for (; r0 + 2 <= a->n_rows; r0 += 2) chunk_block(load, load1, esize, 2, a, r0, k0, k1, scores, m, l, acc);
    if (r0 < a->n_rows) chunk_block(load, load1, esize, 1, a, r0, k0, k1, scores, m, l, acc);
}

static void avx2_attn_chunk(const ember_attn_rows *a, int64_t k0, int64_t k1, float *scores, float *m, float *l,
                            float *acc) {
    switch (a->kv_type) {
    case EMBER_TYPE_F16: chunk_rows(load8_f16, ember_weight_f16, 2, a, k0, k1, scores, m, l, acc); break;
    case EMBER_TYPE_BF16: chunk_rows(load8_bf16, ember_weight_bf16, 2, a, k0, k1, scores, m, l, acc); break;
    default: chunk_rows(load8_f32, ember_weight_f32, 4, a, k0, k1, scores, m, l, acc); break;
    }
}

static void avx2_rmsnorm(float *y, const float *x, const float *w, int64_t n, float eps) {
    const float ss = dot16(x, x, n);
    const float scale = 1.0f / sqrtf(ss / (float)n + eps);
    const __m256 vs = _mm256_set1_ps(scale);
    const int64_t n8 = n & ~(int64_t)7;
    for (int64_t i = 0; i < n8; i += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), vs);
        if (w) v = _mm256_mul_ps(v, _mm256_loadu_ps(w + i));
        _mm256_storeu_ps(y + i, v);
    }
    for (int64_t i = n8; i < n; i++) y[i] = w ? (x[i] * scale) * w[i] : x[i] * scale;
}

static void avx2_silu_mul(float *g, const float *u, int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    const int64_t n8 = n & ~(int64_t)7;
    for (int64_t i = 0; i < n8; i += 8) {
        __m256 x = _mm256_loadu_ps(g + i);
        __m256 s = _mm256_div_ps(x, _mm256_add_ps(one, exp256(_mm256_xor_ps(x, sign)))); /* exp(-x) */
        _mm256_storeu_ps(g + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
    }
    for (int64_t i = n8; i < n; i++) g[i] = ember_s_silu(g[i]) * u[i];
}

/* x / (1 + exp(-2u)), as ember_s_gelu */
EMBER_AI __m256 gelu256(__m256 x) {
    __m256 a = _mm256_mul_ps(_mm256_set1_ps(EMBER_GELU_A), x);
    a = _mm256_mul_ps(a, x);
    a = _mm256_mul_ps(a, x);
    __m256 u = _mm256_mul_ps(_mm256_set1_ps(EMBER_GELU_K), _mm256_add_ps(x, a));
    __m256 nu2 = _mm256_xor_ps(_mm256_add_ps(u, u), _mm256_set1_ps(-0.0f)); /* -2u exactly */
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), exp256(nu2)));
}

static void avx2_gelu_mul(float *g, const float *u, int64_t n) {
    const int64_t n8 = n & ~(int64_t)7;
    for (int64_t i = 0; i < n8; i += 8) {
        __m256 r = gelu256(_mm256_loadu_ps(g + i));
        if (u) r = _mm256_mul_ps(r, _mm256_loadu_ps(u + i));
        _mm256_storeu_ps(g + i, r);
    }
    for (int64_t i = n8; i < n; i++) g[i] = u ? ember_s_gelu(g[i]) * u[i] : ember_s_gelu(g[i]);
}

const ember_kernel_ops ember_kernels_avx2 = {
    .name = "avx2",
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
    .dot_f32 = avx2_dot_f32,
    .mm_t = {TS_MM_T_ENTRIES},
    .attn_chunk = avx2_attn_chunk,
    .rmsnorm = avx2_rmsnorm,
    .layernorm = ember_layernorm,
    .silu_mul = avx2_silu_mul,
    .gelu_mul = avx2_gelu_mul,
    .gelu_mul_ref = ember_gelu_mul_ref,
    .rope_heads = ember_rope_heads_fast,
    .get_row = ember_matrix_get_row,
    .f32_to_f16_row = ember_half_f16_row,
    .f32_to_bf16_row = ember_half_bf16_row,
};
