/* quant_dots.h — the products of the 4- to 6-bit weight types (Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K,
 * Q6_K) that avx2.c and avx512.c share: the activation layouts, the integer dot products and the one
 * order of f32 operations. Included by both files after q8_groups.h, compiled with each file's flags.
 *
 * Why both sets give the same bits: every SIMD instruction here works on exact integers (the sum
 * of a block's weight quants times activation quants); the only f32 arithmetic is written once,
 * below, and is the same in both files. The integer step is the one place the sets differ:
 * avx512.c (compiled with VNNI) multiplies unsigned by signed bytes with vpdpbusd where avx2.c uses
 * vpmaddubsw + vpmaddwd; both give the same exact int32 sums.
 *
 * These row kernels read weights in the file's block layout (EMBER_WEIGHTS=mapped); weights copied
 * at load go into quant_groups.h's 4-row groups and its kernels, with the same integers and order.
 * Activations are quantized once per product, as llama.cpp does: Q8_K for the K-quants, Q8_0 for
 * Q4_0/Q5_0, Q8_1 for Q4_1/Q5_1 (docs/kernels.md, "The fast path of the 4- to 6-bit types"). */
#ifndef EMBER_QUANT_DOTS_H
#define EMBER_QUANT_DOTS_H

#include "quants.h"
#include "q8_groups.h"
#include "quant_groups.h"

/* Tokens one row kernel call multiplies (the weight row is unpacked once for all of them). */
#define QD_MAX_T 4

/* ---- integer primitive: acc + sum of 4 products u8 x s8 per int32 lane (exact) ----
 * u <= 63 and |s| <= 127 everywhere here, so a 16-bit pair sum of vpmaddubsw is at most
 * 2 * 63 * 127 = 16002 and never saturates. */
EMBER_AI __m256i qd_dot_u8s8(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(acc, u, s);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

/* Exact int32 sums of 4 vectors: lane j = sum of the 8 lanes of v_j. */
EMBER_AI __m128i qd_hsum4(__m256i a, __m256i b, __m256i c, __m256i d) {
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

/* Exact int32 sums of two vectors. */
EMBER_AI void qd_hsum2(__m256i a, __m256i b, int32_t *sa, int32_t *sb) {
    const __m256i h = _mm256_hadd_epi32(a, b);
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    s = _mm_hadd_epi32(s, s);
    *sa = _mm_cvtsi128_si32(s);
    *sb = _mm_extract_epi32(s, 1);
}

/* ======================== K-quants x Q8_K activations ========================
 * The row kernels read a token's Q8_K blocks as stored (ember_block_q8_K: f32 d at 0, 256 int8
 * quants at 4, 16 int16 sums of 16 at 260), from ember_quantize_act_q8_k; they sit after the
 * reordered copy the group kernels read (quant_groups.h: qg4k_off_q8k, qg6k_off_q8k).
 *
 * The order of operations, per weight row and token: two f32 sums p and m start at +0; super-block
 * b, in increasing b, contributes its exact integers
 *     A_b = sum over sub-blocks j of sc_j * (sum of the sub-block's q_i * y_i)
 *     B_b = sum over sub-blocks j of mn_j * (sum of the sub-block's y_i)     (Q4_K, Q5_K)
 * (q the stored unsigned quant, Q6_K's minus 32; sc/mn the integer sub-block scales and minimums;
 * y the activation quants) as
 *     p = fma(f32(A_b), f32(d_w) * d_x, p)      m = fma(f32(B_b), f32(dmin_w) * d_x, m)
 * and the result is p - m (Q6_K: p). f32(A_b) rounds to nearest when |A_b| > 2^24. */

#define QD_Q8K_BYTES sizeof(ember_block_q8_K)

EMBER_AI float qd_q8k_d(const uint8_t *yb) {
    float d;
    memcpy(&d, yb, 4);
    return d;
}

/* The 6-bit scales and minimums of a Q4_K/Q5_K super-block (12 packed bytes, ggml's layout):
 * sub-block j < 4: scale = s[j] & 63, min = s[j+4] & 63; j >= 4: scale = s[j+4] & 15 | (s[j-4] >> 6)
 * << 4, min = s[j+4] >> 4 | (s[j] >> 6) << 4. Done 4 bytes at a time: words w0 = s[0..3],
 * w1 = s[4..7], w2 = s[8..11]. Returns the 8 scales in bytes 0-7 and the 8 minimums in 8-15. */
EMBER_AI __m128i qd_k4_scales(const uint8_t *s) {
    uint32_t w[3], u[4];
    memcpy(w, s, 12);
    u[0] = w[0] & 0x3f3f3f3fu;                                               /* scales 0-3 */
    u[1] = (w[2] & 0x0f0f0f0fu) | (((w[0] >> 6) & 0x03030303u) << 4);        /* scales 4-7 */
    u[2] = w[1] & 0x3f3f3f3fu;                                               /* mins 0-3 */
    u[3] = ((w[2] >> 4) & 0x0f0f0f0fu) | (((w[1] >> 6) & 0x03030303u) << 4); /* mins 4-7 */
    return _mm_loadu_si128((const __m128i *)u);
}

/* Shuffle controls that broadcast int16 lane j of each 128-bit half to all 8 lanes of it. */
EMBER_AI __m256i qd_bcast16_ctl(int j) { return _mm256_set1_epi16((short)(2 * j | (2 * j + 1) << 8)); }

/* Q4_K / Q5_K (five = true) row times T tokens. Super-block: d, dmin (f16), scales[12], [Q5_K:
 * qh[32]], qs[128]; chunk c (64 values) = qs[32c .. 32c+31], low nibbles sub-block 2c, high nibbles
 * 2c+1; Q5_K's fifth bit of value 64c + l (+32) is bit 2c (2c+1) of qh[l]. Quants in [0, 31]. */
EMBER_AI void qd_k45_row(bool five, const uint8_t *row, const uint8_t *const *xs, int T, int64_t nb, float *out) {
    const size_t bbytes = five ? sizeof(ember_block_q5_K) : sizeof(ember_block_q4_K);
    const size_t oqs = five ? 48 : 16;
    const __m256i low4 = _mm256_set1_epi8(0x0F), b16 = _mm256_set1_epi8(16);
    float p[QD_MAX_T], m[QD_MAX_T];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) p[t] = m[t] = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + (size_t)b * bbytes;
        const __m128i scmn = qd_k4_scales(blk + 4);
        /* mn_j at int16 lanes 2j, 2j+1: the two sums of 16 of sub-block j */
        const __m128i mn8 = _mm_unpackhi_epi64(scmn, scmn);
        const __m256i mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn8, mn8));
        /* the 8 scales as int16 in both 128-bit halves, for per-sub-block broadcasts */
        const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(scmn));
        __m256i acc[QD_MAX_T];
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) acc[t] = _mm256_setzero_si256();
        const __m256i hb = five ? _mm256_loadu_si256((const __m256i *)(blk + 16)) : _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(blk + oqs + 32 * c));
            __m256i lo = _mm256_and_si256(v, low4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
            if (five) {
                const __m256i bl = _mm256_set1_epi8((char)(1 << (2 * c))), bh = _mm256_set1_epi8((char)(2 << (2 * c)));
                lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hb, bl), bl), b16));
                hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hb, bh), bh), b16));
            }
            const __m256i slo = _mm256_shuffle_epi8(sc16, qd_bcast16_ctl(2 * c));
            const __m256i shi = _mm256_shuffle_epi8(sc16, qd_bcast16_ctl(2 * c + 1));
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                const uint8_t *yq = xs[t] + (size_t)b * QD_Q8K_BYTES + 4 + 64 * c;
                /* pair sums <= 2 * 31 * 127; times a 6-bit scale in int32 */
                acc[t] = _mm256_add_epi32(
                    acc[t], _mm256_madd_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)yq)), slo));
                acc[t] = _mm256_add_epi32(
                    acc[t],
                    _mm256_madd_epi16(_mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(yq + 32))), shi));
            }
        }
        const float dw = ember_h2f(ember_load_u16(blk)), dmw = ember_h2f(ember_load_u16(blk + 2));
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            const uint8_t *yb = xs[t] + (size_t)b * QD_Q8K_BYTES;
            const __m256i bm = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(yb + 260)), mins);
            int32_t A, B;
            qd_hsum2(acc[t], bm, &A, &B);
            const float dx = qd_q8k_d(yb);
            p[t] = fmaf((float)A, dw * dx, p[t]);
            m[t] = fmaf((float)B, dmw * dx, m[t]);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) out[t] = p[t] - m[t];
}

/* Q6_K row times T tokens. Super-block: ql[128], qh[64], int8 scales[16], d (f16). Half n (128
 * values): a = ql[64n ..], b = ql[64n + 32 ..], h = qh[32n ..]; value 128n + 32k + l is
 *   k=0: a & 15 | (h & 3) << 4     k=1: b & 15 | (h >> 2 & 3) << 4
 *   k=2: a >> 4 | (h >> 4 & 3) << 4 k=3: b >> 4 | (h >> 6) << 4
 * minus 32, with the scale of its sub-block of 16 (index value / 16). The unsigned quants (in
 * [0, 63]) are multiplied, and 32 * sum_j sc_j * bsum_j is subtracted: the exact A_b. */
EMBER_AI void qd_q6k_row(const uint8_t *row, const uint8_t *const *xs, int T, int64_t nb, float *out) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x03), m0c = _mm256_set1_epi8(0x0C),
                  m30 = _mm256_set1_epi8(0x30), mc0 = _mm256_set1_epi8((char)0xC0);
    __m256i pair_ctl[4];
    for (int j = 0; j < 4; j++)
        pair_ctl[j] = _mm256_set_m128i(_mm256_castsi256_si128(qd_bcast16_ctl(2 * j + 1)),
                                       _mm256_castsi256_si128(qd_bcast16_ctl(2 * j)));
    float p[QD_MAX_T];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) p[t] = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + (size_t)b * sizeof(ember_block_q6_K);
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)(blk + 192));
        const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
        /* scales 0-7 (8-15) as int16 in both halves: pair j takes lane 2j' in the low half and 2j'+1
         * in the high half (j' = j mod 4) by one shuffle */
        const __m256i sc_lo = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(sc16));
        const __m256i sc_hi = _mm256_broadcastsi128_si256(_mm256_extracti128_si256(sc16, 1));
        __m256i acc[QD_MAX_T];
        /* start from -32 * sum_j sc_j * bsum_j: the offset of the unsigned quants */
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            const __m256i bs = _mm256_loadu_si256((const __m256i *)(xs[t] + (size_t)b * QD_Q8K_BYTES + 260));
            acc[t] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(bs, sc16), 5));
        }
#pragma GCC unroll 2
        for (int n = 0; n < 2; n++) {
            const __m256i a = _mm256_loadu_si256((const __m256i *)(blk + 64 * n));
            const __m256i bb = _mm256_loadu_si256((const __m256i *)(blk + 64 * n + 32));
            const __m256i h = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * n));
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(a, low4), _mm256_slli_epi16(_mm256_and_si256(h, m2), 4));
            q[1] = _mm256_or_si256(_mm256_and_si256(bb, low4), _mm256_slli_epi16(_mm256_and_si256(h, m0c), 2));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), low4), _mm256_and_si256(h, m30));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bb, 4), low4),
                                   _mm256_srli_epi16(_mm256_and_si256(h, mc0), 2));
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                /* int16 lanes 0-7: scale of sub-block 2j, lanes 8-15: of 2j + 1 (j = 4n + k) */
                const int j = 4 * n + k;
                const __m256i s = _mm256_shuffle_epi8(j < 4 ? sc_lo : sc_hi, pair_ctl[j % 4]);
#pragma GCC unroll 4
                for (int t = 0; t < T; t++) {
                    const __m256i y =
                        _mm256_loadu_si256((const __m256i *)(xs[t] + (size_t)b * QD_Q8K_BYTES + 4 + 32 * j));
                    acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(_mm256_maddubs_epi16(q[k], y), s));
                }
            }
        }
        const float dw = ember_h2f(ember_load_u16(blk + 208));
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            int32_t A, unused;
            qd_hsum2(acc[t], _mm256_setzero_si256(), &A, &unused);
            p[t] = fmaf((float)A, dw * qd_q8k_d(xs[t] + (size_t)b * QD_Q8K_BYTES), p[t]);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) out[t] = p[t];
}

/* ======================== 32-value blocks x Q8_0 / Q8_1 activations ========================
 * Prepared activations: q8g's layout (q8_groups.h: the quants in block order at q8g_off_plain, d_x
 * as f32 at q8g_off_dx, -128 * sum of quants at q8g_off_corr, all padded with zeros to a multiple
 * of 8 blocks), made by the set's own Q8_0 quantizer; for Q8_1, followed by s_x per block as f32
 * (the f16 value of d * sum q, d = amax / 127 unrounded: llama.cpp's x86 quantize_row_q8_1).
 *
 * The order of operations, per weight row and token: Q8_0's (docs/kernels.md). Four f32 partial
 * sums p0..p3 start at +0; block b adds into p[b % 4]
 *     p = fma(f32(isum_b), f32(d_w) * d_x, p)          then (Q4_1, Q5_1) p = fma(f32(m_w), s_x, p)
 * with isum_b the exact sum of the 32 products (quant - offset) * y; the result is
 * (p0 + p1) + (p2 + p3). Blocks past the row's end are zeros and change nothing. */

typedef enum { QD_Q4_0, QD_Q4_1, QD_Q5_0, QD_Q5_1 } qd_kind;

static size_t qd_q81_act_size(int64_t n_in) {
    return q8g_act_size(n_in) + (size_t)q8g_spans(n_in / 32) * Q8G_SPAN_BLOCKS * 4;
}

/* The Q8_1 sums s_x, after the set's Q8_0 quantizer has filled the q8g part (same d and quants). */
static void qd_q81_sums(const float *x, uint8_t *xa, int64_t n_in) {
    const int64_t nb = n_in / 32, nb8 = q8g_spans(nb) * Q8G_SPAN_BLOCKS;
    float *s = (float *)(xa + q8g_act_size(n_in));
    const int32_t *corr = (const int32_t *)(xa + q8g_off_corr(nb));
    for (int64_t b = 0; b < nb; b++) {
        float amax = 0.0f;
        bool finite = true;
        for (int j = 0; j < 32; j++) {
            const float a = fabsf(x[32 * b + j]);
            if (!(a < INFINITY)) finite = false;
            else if (a > amax) amax = a;
        }
        const int32_t sum = -corr[b] / 128; /* exact: corr = -128 * sum */
        s[b] = finite ? ember_h2f(_cvtss_sh((amax / 127.0f) * (float)sum, _MM_FROUND_TO_NEAREST_INT)) : NAN;
    }
    for (int64_t b = nb; b < nb8; b++) s[b] = 0.0f;
}

/* The 32 unsigned quants of one block ([0, 15] or [0, 31]): value j < 16 is the low nibble of
 * qs[j], j >= 16 the high nibble of qs[j - 16]; Q5's fifth bit of value j is bit j of qh (LE u32). */
EMBER_AI __m256i qd_blk32_quants(qd_kind kind, const uint8_t *blk) {
    const bool five = kind == QD_Q5_0 || kind == QD_Q5_1, has_m = kind == QD_Q4_1 || kind == QD_Q5_1;
    const size_t oqh = has_m ? 4 : 2, oqs = oqh + (five ? 4 : 0);
    const __m128i x = _mm_loadu_si128((const __m128i *)(blk + oqs));
    const __m128i low4 = _mm_set1_epi8(0x0F);
    __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(x, 4), low4), _mm_and_si128(x, low4));
    if (five) {
        uint32_t qh;
        memcpy(&qh, blk + oqh, 4);
        /* byte j gets qh byte j / 8 (the shuffle stays in each 128-bit half: bytes 0-1 low, 2-3 high) */
        const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh),
                                                   _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2,
                                                                    2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
        const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
        const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
        q = _mm256_or_si256(q, _mm256_and_si256(set, _mm256_set1_epi8(16)));
    }
    return q;
}

EMBER_AI size_t qd_blk32_bytes(qd_kind kind) {
    return kind == QD_Q4_0   ? sizeof(ember_block_q4_0)
           : kind == QD_Q4_1 ? sizeof(ember_block_q4_1)
           : kind == QD_Q5_0 ? sizeof(ember_block_q5_0)
                             : sizeof(ember_block_q5_1);
}

/* One row of 32-value blocks times T tokens, 4 blocks at a time (4 exact sums in one vector). */
EMBER_AI void qd_blk32_row(qd_kind kind, const uint8_t *row, const uint8_t *const *xs, int T, int64_t nb, int64_t n_in,
                           float *out) {
    const size_t bbytes = qd_blk32_bytes(kind);
    const bool has_m = kind == QD_Q4_1 || kind == QD_Q5_1;
    const size_t oplain = q8g_off_plain(nb), odx = q8g_off_dx(nb), ocorr = q8g_off_corr(nb), os = q8g_act_size(n_in);
    __m128 p[QD_MAX_T];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) p[t] = _mm_setzero_ps();
    for (int64_t b = 0; b < nb; b += 4) {
        __m256i q[4];
        uint16_t d[4] = {0, 0, 0, 0}, mw[4] = {0, 0, 0, 0};
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            if (b + j >= nb) { /* padding: weight 0, scale 0 */
                q[j] = _mm256_setzero_si256();
                continue;
            }
            const uint8_t *blk = row + (size_t)(b + j) * bbytes;
            q[j] = qd_blk32_quants(kind, blk);
            d[j] = ember_load_u16(blk);
            if (has_m) mw[j] = ember_load_u16(blk + 2);
        }
        const __m128 dw = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)d));
        const __m128 mwf = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)mw));
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            const uint8_t *ya = xs[t] + oplain + 32 * (size_t)b;
            __m256i l[4];
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++)
                l[j] = qd_dot_u8s8(_mm256_setzero_si256(), q[j], _mm256_loadu_si256((const __m256i *)(ya + 32 * j)));
            __m128i isum = qd_hsum4(l[0], l[1], l[2], l[3]);
            if (!has_m) { /* quants carry an offset of 8 (Q4_0) or 16 (Q5_0): subtract offset * sum y */
                const __m128i corr = _mm_loadu_si128((const __m128i *)(xs[t] + ocorr + 4 * (size_t)b)); /* -128 sum y */
                isum = _mm_add_epi32(isum, _mm_srai_epi32(corr, kind == QD_Q4_0 ? 4 : 3));
            }
            const __m128 dx = _mm_loadu_ps((const float *)(xs[t] + odx) + b);
            p[t] = _mm_fmadd_ps(_mm_cvtepi32_ps(isum), _mm_mul_ps(dw, dx), p[t]);
            if (has_m) p[t] = _mm_fmadd_ps(mwf, _mm_loadu_ps((const float *)(xs[t] + os) + b), p[t]);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) out[t] = q8g_row_finish(p[t]);
}

/* ---- the rows driver: each output row, tokens QD_MAX_T at a time ---- */
typedef void (*qd_row_fn)(const uint8_t *row, const uint8_t *const *xs, int64_t nb, int64_t n_in, float *out);

static void qd_rows(const qd_row_fn kern[QD_MAX_T], int64_t block, const ember_matrix *w, const void *xa,
                    size_t xa_stride, float *y, int64_t n_tok, int64_t o0, int64_t o1) {
    const int64_t nb = w->n_in / block;
    for (int64_t o = o0; o < o1; o++) {
        const uint8_t *row = (const uint8_t *)(w->packed ? w->packed : w->data) + (size_t)o * w->row_bytes;
        for (int64_t t = 0; t < n_tok; t += QD_MAX_T) {
            const int T = n_tok - t < QD_MAX_T ? (int)(n_tok - t) : QD_MAX_T;
            const uint8_t *xs[QD_MAX_T];
            for (int k = 0; k < T; k++) xs[k] = (const uint8_t *)xa + (size_t)(t + k) * xa_stride;
            float out[QD_MAX_T];
            kern[T - 1](row, xs, nb, w->n_in, out);
            for (int k = 0; k < T; k++) y[(t + k) * w->n_out + o] = out[k];
        }
    }
}

/* Instances with T fixed (1..4) so each is compiled for its tile. */
#define QD_INSTANCES(name, call)                                                                                       \
    static void name##_1(const uint8_t *r, const uint8_t *const *xs, int64_t nb, int64_t n_in, float *o) { call(1); }  \
    static void name##_2(const uint8_t *r, const uint8_t *const *xs, int64_t nb, int64_t n_in, float *o) { call(2); }  \
    static void name##_3(const uint8_t *r, const uint8_t *const *xs, int64_t nb, int64_t n_in, float *o) { call(3); }  \
    static void name##_4(const uint8_t *r, const uint8_t *const *xs, int64_t nb, int64_t n_in, float *o) { call(4); }  \
    static const qd_row_fn name[QD_MAX_T] = {name##_1, name##_2, name##_3, name##_4};

#define QD_CALL_Q4K(T) ((void)n_in, qd_k45_row(false, r, xs, T, nb, o))
#define QD_CALL_Q5K(T) ((void)n_in, qd_k45_row(true, r, xs, T, nb, o))
#define QD_CALL_Q6K(T) ((void)n_in, qd_q6k_row(r, xs, T, nb, o))
#define QD_CALL_Q40(T) qd_blk32_row(QD_Q4_0, r, xs, T, nb, n_in, o)
#define QD_CALL_Q41(T) qd_blk32_row(QD_Q4_1, r, xs, T, nb, n_in, o)
#define QD_CALL_Q50(T) qd_blk32_row(QD_Q5_0, r, xs, T, nb, n_in, o)
#define QD_CALL_Q51(T) qd_blk32_row(QD_Q5_1, r, xs, T, nb, n_in, o)
QD_INSTANCES(qd_kern_q4k, QD_CALL_Q4K)
QD_INSTANCES(qd_kern_q5k, QD_CALL_Q5K)
QD_INSTANCES(qd_kern_q6k, QD_CALL_Q6K)
QD_INSTANCES(qd_kern_q40, QD_CALL_Q40)
QD_INSTANCES(qd_kern_q41, QD_CALL_Q41)
QD_INSTANCES(qd_kern_q50, QD_CALL_Q50)
QD_INSTANCES(qd_kern_q51, QD_CALL_Q51)

#define QD_ROWS_FN(fname, kern, block)                                                                                 \
    static void fname(const ember_matrix *w, const float *x, const void *xa, size_t xa_stride, float *y,               \
                      int64_t n_tok, int64_t o0, int64_t o1) {                                                         \
        (void)x;                                                                                                       \
        qd_rows(kern, block, w, xa, xa_stride, y, n_tok, o0, o1);                                                      \
    }

/* Q4_0, Q4_K, Q6_K: repacked weights go through the 4-row group kernels (quant_groups.h); weights
 * read in place (EMBER_WEIGHTS=mapped) through the row kernels, which for the K-quants read the
 * Q8_K blocks stored after the reordered activations. Both give the same bits. */
#define QD_ROWS_32(fname, rowkern, groupkern, kind)                                                                    \
    static void fname(const ember_matrix *w, const float *x, const void *xa, size_t xa_stride, float *y,               \
                      int64_t n_tok, int64_t o0, int64_t o1) {                                                         \
        (void)x;                                                                                                       \
        const int64_t nb = w->n_in / 32;                                                                               \
        if (w->packed)                                                                                                 \
            qg_rows(groupkern, QG_MAX_T, qg32_group_bytes(kind, nb), nb, w, xa, xa_stride, y, n_tok, o0, o1);          \
        else qd_rows(rowkern, 32, w, xa, xa_stride, y, n_tok, o0, o1);                                                 \
    }
QD_ROWS_32(qd_rows_q4_0, qd_kern_q40, qg40_kern, QG_Q4_0)
QD_ROWS_32(qd_rows_q4_1, qd_kern_q41, qg41_kern, QG_Q4_1)
QD_ROWS_32(qd_rows_q5_0, qd_kern_q50, qg50_kern, QG_Q5_0)
QD_ROWS_32(qd_rows_q5_1, qd_kern_q51, qg51_kern, QG_Q5_1)
static void qd_rows_q4_k(const ember_matrix *w, const float *x, const void *xa, size_t xa_stride, float *y,
                         int64_t n_tok, int64_t o0, int64_t o1) {
    (void)x;
    const int64_t nb = w->n_in / EMBER_QK_K;
    if (w->packed) qg_rows(qg4k_kern, QG_TILE_4K, (size_t)nb * QG4K_SB_BYTES, nb, w, xa, xa_stride, y, n_tok, o0, o1);
    else qd_rows(qd_kern_q4k, EMBER_QK_K, w, (const uint8_t *)xa + qg4k_off_q8k(nb), xa_stride, y, n_tok, o0, o1);
}
static void qd_rows_q5_k(const ember_matrix *w, const float *x, const void *xa, size_t xa_stride, float *y,
                         int64_t n_tok, int64_t o0, int64_t o1) {
    (void)x;
    const int64_t nb = w->n_in / EMBER_QK_K;
    if (w->packed) qg_rows(qg5k_kern, QG_MAX_T, (size_t)nb * QG5K_SB_BYTES, nb, w, xa, xa_stride, y, n_tok, o0, o1);
    else qd_rows(qd_kern_q5k, EMBER_QK_K, w, (const uint8_t *)xa + qg4k_off_q8k(nb), xa_stride, y, n_tok, o0, o1);
}
static void qd_rows_q6_k(const ember_matrix *w, const float *x, const void *xa, size_t xa_stride, float *y,
                         int64_t n_tok, int64_t o0, int64_t o1) {
    (void)x;
    const int64_t nb = w->n_in / EMBER_QK_K;
    if (w->packed) qg_rows(qg6k_kern, QG_MAX_T, (size_t)nb * QG6K_SB_BYTES, nb, w, xa, xa_stride, y, n_tok, o0, o1);
    else qd_rows(qd_kern_q6k, EMBER_QK_K, w, (const uint8_t *)xa + qg6k_off_q8k(nb), xa_stride, y, n_tok, o0, o1);
}

/* The kernel-table entries; q8_size / q8_prep: the set's Q8_0 activation layout and quantizer,
 * q81_prep: the same followed by qd_q81_sums. Q2_K/Q3_K: the explicit fallback (kernels.h). */
#define QD_MM_ENTRIES(q8_size, q8_prep, q81_prep)                                                                      \
    [EMBER_TYPE_Q4_K] = {.act_size = qg4k_act_size,                                                                    \
                         .act_prepare = qg4k_act_prepare,                                                              \
                         .rows = qd_rows_q4_k,                                                                         \
                         .pack_size = qg4k_pack_size,                                                                  \
                         .pack = qg4k_pack},                                                                           \
    [EMBER_TYPE_Q5_K] = {.act_size = qg4k_act_size,                                                                    \
                         .act_prepare = qg4k_act_prepare,                                                              \
                         .rows = qd_rows_q5_k,                                                                         \
                         .pack_size = qg5k_pack_size,                                                                  \
                         .pack = qg5k_pack},                                                                           \
    [EMBER_TYPE_Q6_K] = {.act_size = qg6k_act_size,                                                                    \
                         .act_prepare = qg6k_act_prepare,                                                              \
                         .rows = qd_rows_q6_k,                                                                         \
                         .pack_size = qg6k_pack_size,                                                                  \
                         .pack = qg6k_pack},                                                                           \
    [EMBER_TYPE_Q4_0] = {.act_size = q8_size,                                                                          \
                         .act_prepare = q8_prep,                                                                       \
                         .rows = qd_rows_q4_0,                                                                         \
                         .pack_size = qg_pack_size_q4_0,                                                               \
                         .pack = qg_pack_q4_0},                                                                        \
    [EMBER_TYPE_Q5_0] = {.act_size = q8_size,                                                                          \
                         .act_prepare = q8_prep,                                                                       \
                         .rows = qd_rows_q5_0,                                                                         \
                         .pack_size = qg_pack_size_q5_0,                                                               \
                         .pack = qg_pack_q5_0},                                                                        \
    [EMBER_TYPE_Q4_1] = {.act_size = qd_q81_act_size,                                                                  \
                         .act_prepare = q81_prep,                                                                      \
                         .rows = qd_rows_q4_1,                                                                         \
                         .pack_size = qg_pack_size_q4_1,                                                               \
                         .pack = qg_pack_q4_1},                                                                        \
    [EMBER_TYPE_Q5_1] = {.act_size = qd_q81_act_size,                                                                  \
                         .act_prepare = q81_prep,                                                                      \
                         .rows = qd_rows_q5_1,                                                                         \
                         .pack_size = qg_pack_size_q5_1,                                                               \
                         .pack = qg_pack_q5_1},                                                                        \
    EMBER_MM_REFERENCE_PRODUCTS

#endif
