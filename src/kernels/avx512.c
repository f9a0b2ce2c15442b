/* avx512.c — the AVX-512 kernel set (F, BW, VL, VNNI), compiled with its own -mavx512* flags and
 * called only after dispatch.c has checked CPUID and XCR0. It must follow the common order of
 * operations of simd_common.h / docs/kernels.md, which avx2.c reproduces bit for bit.
 *
 * Matrix products are register-tiled: R weight rows x T tokens of 16-lane accumulators, so each
 * weight vector loaded is used T times (prefill) and each activation vector R times. */
#include "simd_common.h"

#include <stdlib.h>

/* ---- f32 / f16 / bf16 weights: f32 activations, one fused multiply-add per element ---- */

EMBER_AI __m512 load_w16(ember_type type, const uint8_t *row, int64_t i) {
    if (type == EMBER_TYPE_F32) return _mm512_loadu_ps(row + 4 * i);
    __m256i h = _mm256_loadu_si256((const __m256i *)(row + 2 * i));
    if (type == EMBER_TYPE_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); /* bf16: high half */
}

EMBER_AI float reduce512(__m512 a) {
    return ember_reduce16(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
}

/* out[r*T + t] = row r . token t over n values, in the common order. */
EMBER_AI void float_tile(ember_type type, const uint8_t *const *rows, const float *const *xs, int R, int T, int64_t n,
                         float *out) {
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
            __m512 wv = load_w16(type, rows[r], i);
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) acc[r][t] = _mm512_fmadd_ps(wv, xv[t], acc[r][t]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            float s = reduce512(acc[r][t]);
            for (int64_t i = n16; i < n; i++) s = fmaf(ember_weight_f(type, rows[r], i), xs[t][i], s);
            out[r * T + t] = s;
        }
}

/* ---- q8_0 weights x q8_0-quantized activations ----
 * VNNI's vpdpbusd multiplies unsigned by signed bytes and sums 4 adjacent products into an int32
 * lane. Multi-token tiles feed the activation quants as u = q + 128 (q xor 0x80; q in [-127, 127],
 * so u in [1, 255]) and the weights as they are: dpbusd(u, w) = sum q w + 128 sum w, so each lane's
 * integer sum starts at -128 sum w (itself a vpdpbusd of the constant 128 by w) and ends at exactly
 * sum_{j=4l..4l+3} w_j q_j — the integers AVX2 gets from maddubs. The single-token kernel swaps
 * the roles (weights as w + 128, signed quants, the token's -128 sum q precomputed) so that its
 * per-block work does not depend on the weights twice. Weight scales sit 34 bytes apart; they are
 * loaded 16 blocks at a time and spread per pair of blocks into [d_2p x8, d_2p+1 x8], matching the
 * lanes (a pair of blocks fills one register: lanes 0-7 and 8-15 of the common order). */
#ifndef EMBER_Q8_PREFETCH
#define EMBER_Q8_PREFETCH 512
#endif

EMBER_AI int64_t q8_pad16(int64_t nb) { return (nb + 15) & ~(int64_t)15; }
EMBER_AI size_t q8_quant_bytes(int64_t nb) { return (size_t)((nb + 1) & ~(int64_t)1) * EMBER_QK8_0; }
/* Section offsets of one token's prepared activations:
 *   [0]          u = q + 128 per block, pairs padded (read by the multi-token tiles)
 *   [scales]     d_x per block as f32, zero-padded to a multiple of 16
 *   [signed]     q as int8, same layout as the first section (read by the single-token kernel)
 *   [corr]       per pair 16 int32: -128 * (sum of each lane's 4 quants) (single-token kernel) */
EMBER_AI size_t q8_off_scales(int64_t nb) { return q8_quant_bytes(nb); }
EMBER_AI size_t q8_off_signed(int64_t nb) { return q8_off_scales(nb) + (size_t)q8_pad16(nb) * sizeof(float); }
EMBER_AI size_t q8_off_corr(int64_t nb) { return q8_off_signed(nb) + q8_quant_bytes(nb); }
static size_t q8_act_size(int64_t n_in) {
    const int64_t nb = n_in / EMBER_QK8_0;
    return q8_off_corr(nb) + (size_t)((nb + 1) / 2) * 64;
}

static void q8_prepare(const float *x, uint8_t *xa, int64_t n_in) {
    const int64_t nb = n_in / EMBER_QK8_0;
    float *dxs = (float *)(xa + q8_off_scales(nb));
    const __m512 inf = _mm512_set1_ps(INFINITY);
    const __m128i flip = _mm_set1_epi8((char)0x80);
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *q = xa + b * EMBER_QK8_0;
        __m512 v0 = _mm512_loadu_ps(x + b * 32), v1 = _mm512_loadu_ps(x + b * 32 + 16);
        __m512 a0 = _mm512_abs_ps(v0), a1 = _mm512_abs_ps(v1);
        __mmask16 bad = _mm512_cmp_ps_mask(a0, inf, _CMP_NLT_UQ) | _mm512_cmp_ps_mask(a1, inf, _CMP_NLT_UQ);
        if (bad) { /* NaN or infinity in the block: d = NaN, quants 0 (as ember_quantize_row_q8_0) */
            memset(q, 0x80, EMBER_QK8_0);
            dxs[b] = ember_h2f(0x7e00);
            continue;
        }
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1)); /* max is exact in any order */
        const uint16_t d16 = _cvtss_sh(amax / 127.0f, _MM_FROUND_TO_NEAREST_INT);
        const __m512 m = _mm512_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
        /* round half to even, like nearbyintf in the default mode; |values| <= 127 */
        __m512i i0 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(v0, m), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m512i i1 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(v1, m), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm_storeu_si128((__m128i *)q, _mm_xor_si128(_mm512_cvtsepi32_epi8(i0), flip));
        _mm_storeu_si128((__m128i *)(q + 16), _mm_xor_si128(_mm512_cvtsepi32_epi8(i1), flip));
        dxs[b] = ember_h2f(d16);
    }
    if (nb & 1) memset(xa + nb * EMBER_QK8_0, 0x80, EMBER_QK8_0); /* the empty half: q = 0 */
    for (int64_t b = nb; b < q8_pad16(nb); b++) dxs[b] = 0.0f;
    /* the single-token kernel's sections: signed quants and each lane's correction */
    const __m512i flip512 = _mm512_set1_epi8((char)0x80);
    uint8_t *sq = xa + q8_off_signed(nb), *corr = xa + q8_off_corr(nb);
    for (int64_t p = 0; p < (nb + 1) / 2; p++) {
        const __m512i q = _mm512_xor_si512(_mm512_loadu_si512(xa + p * 64), flip512);
        _mm512_storeu_si512(sq + p * 64, q);
        const __m512i sum128 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), flip512, q); /* 128 * lane sum */
        _mm512_storeu_si512(corr + p * 64, _mm512_sub_epi32(_mm512_setzero_si512(), sum128));
    }
}

/* The f16 scales of blocks b0 .. b0+15 of a raw q8_0 row as f32 (blocks >= nb read as 0). They sit
 * 34 bytes apart; 16 scalar loads beat a gather on the development machine (AMD Zen 4). */
EMBER_AI __m512 q8_row_scales16(const uint8_t *row, int64_t b0, int64_t nb) {
    const uint8_t *p = row + b0 * sizeof(ember_block_q8_0);
    const int64_t left = nb - b0;
    __m128i lo = _mm_setzero_si128(), hi = _mm_setzero_si128();
    if (left >= 16) {
#define Q8_D(i) (int)ember_load_u16(p + (i) * sizeof(ember_block_q8_0))
        lo = _mm_insert_epi16(_mm_insert_epi16(_mm_insert_epi16(_mm_insert_epi16(_mm_insert_epi16(_mm_insert_epi16(
                 _mm_insert_epi16(_mm_cvtsi32_si128(Q8_D(0)), Q8_D(1), 1), Q8_D(2), 2), Q8_D(3), 3), Q8_D(4), 4), Q8_D(5), 5),
                 Q8_D(6), 6), Q8_D(7), 7);
        hi = _mm_insert_epi16(_mm_insert_epi16(_mm_insert_epi16(_mm_insert_epi16(_mm_insert_epi16(_mm_insert_epi16(
                 _mm_insert_epi16(_mm_cvtsi32_si128(Q8_D(8)), Q8_D(9), 1), Q8_D(10), 2), Q8_D(11), 3), Q8_D(12), 4),
                 Q8_D(13), 5), Q8_D(14), 6), Q8_D(15), 7);
#undef Q8_D
    } else {
        uint16_t h[16] = {0};
        for (int i = 0; i < left; i++) h[i] = ember_load_u16(p + i * sizeof(ember_block_q8_0));
        lo = _mm_loadu_si128((const __m128i *)h);
        hi = _mm_loadu_si128((const __m128i *)(h + 8));
    }
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1));
}

/* [v[2p] x8, v[2p+1] x8] */
EMBER_AI __m512 q8_spread(__m512 v, int p) {
    const __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(2 * p),
                                         _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
    return _mm512_permutexvar_ps(idx, v);
}

/* Pair p (blocks 2p, 2p+1) of a raw q8_0 row, both halves, or the lower half only (zero above). */
EMBER_AI __m512i q8_row_pair(const uint8_t *row, int64_t p, bool half) {
    const uint8_t *blk = row + p * 2 * sizeof(ember_block_q8_0);
    __m256i lo = _mm256_loadu_si256((const __m256i *)(blk + 2));
    if (half) return _mm512_zextsi256_si512(lo);
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), _mm256_loadu_si256((const __m256i *)(blk + 36)), 1);
}

EMBER_AI void q8_tile(const uint8_t *const *rows, const uint8_t *const *xas, int R, int T, int64_t nb, float *out) {
    const __m512i c128 = _mm512_set1_epi8((char)0x80);
    const int64_t np = (nb + 1) / 2;
    const float *dxs[4];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) dxs[t] = (const float *)(xas[t] + q8_off_scales(nb));
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    for (int64_t g = 0; g < np; g += 8) { /* 8 pairs = 16 blocks share one scale gather */
        __m512 dw[4], dx[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) dw[r] = q8_row_scales16(rows[r], 2 * g, nb);
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) dx[t] = _mm512_loadu_ps(dxs[t] + 2 * g);
        const int pe = np - g < 8 ? (int)(np - g) : 8;
        for (int pi = 0; pi < pe; pi++) {
            const int64_t p = g + pi;
            const bool half = 2 * p + 1 == nb; /* the odd last block: upper lanes add exactly +0 */
            __m512 dxp[4];
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) dxp[t] = q8_spread(dx[t], pi);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                _mm_prefetch((const char *)rows[r] + p * 2 * sizeof(ember_block_q8_0) + EMBER_Q8_PREFETCH, _MM_HINT_T0);
                const __m512i w = q8_row_pair(rows[r], p, half);
                /* -128 * (sum of the lane's 4 weights): the start of each lane's integer sum */
                const __m512i base = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), c128, w));
                const __m512 dwp = q8_spread(dw[r], pi);
#pragma GCC unroll 4
                for (int t = 0; t < T; t++) {
                    const __m512i is = _mm512_dpbusd_epi32(base, _mm512_loadu_si512(xas[t] + p * 64), w);
                    acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(dwp, dxp[t]), acc[r][t]);
                }
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) out[r * T + t] = reduce512(acc[r][t]);
}

/* One weight row times one token (decode): the weights go in as u8 = w xor 0x80 = w + 128 and the
 * signed activation quants as s8, so each lane starts from the token's precomputed correction
 * -128 * (sum of its 4 quants) and ends at the same exact integer as the tiles compute. The 16
 * products d_w * d_x of a group of blocks are formed once and spread per pair. */
EMBER_AI float q8_row_token(const uint8_t *row, const uint8_t *xa, int64_t nb) {
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    const uint8_t *sq = xa + q8_off_signed(nb), *corr = xa + q8_off_corr(nb);
    const float *dxs = (const float *)(xa + q8_off_scales(nb));
    const int64_t np = (nb + 1) / 2;
    __m512 acc = _mm512_setzero_ps();
#define Q8_ROW_PAIR(pi, half)                                                                                      \
    do {                                                                                                           \
        const int64_t p = g + (pi);                                                                                \
        _mm_prefetch((const char *)row + p * 2 * sizeof(ember_block_q8_0) + EMBER_Q8_PREFETCH, _MM_HINT_T0);        \
        const __m512i w = _mm512_xor_si512(q8_row_pair(row, p, half), flip);                                       \
        /* a half-empty pair: w' = 128 above, times q = 0 there, plus correction 0: exactly 0 */                  \
        const __m512i is = _mm512_dpbusd_epi32(_mm512_loadu_si512(corr + p * 64), w, _mm512_loadu_si512(sq + p * 64)); \
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), q8_spread(s16, pi), acc);                                    \
    } while (0)
    int64_t g = 0;
    for (; g + 8 <= nb / 2; g += 8) { /* whole groups: 16 blocks, no half pair */
        const __m512 s16 = _mm512_mul_ps(q8_row_scales16(row, 2 * g, nb), _mm512_loadu_ps(dxs + 2 * g));
#pragma GCC unroll 8
        for (int pi = 0; pi < 8; pi++) Q8_ROW_PAIR(pi, false);
    }
    if (g < np) {
        const __m512 s16 = _mm512_mul_ps(q8_row_scales16(row, 2 * g, nb), _mm512_loadu_ps(dxs + 2 * g));
        for (int pi = 0; pi < np - g; pi++) Q8_ROW_PAIR(pi, 2 * (g + pi) + 1 == nb);
    }
#undef Q8_ROW_PAIR
    return reduce512(acc);
}

/* ---- q8_0 weights repacked at load (ember_compute_pack) ----
 * Rows are taken 4 at a time; for each group of 16 blocks (8 pairs) of those rows:
 *   128 bytes   the 4 rows' 16 f16 scales (row r at 32 r), 0 for missing blocks or rows
 *   pe * 256    for each pair of blocks: the 4 rows' 64 quants as u8 = w + 128, 0x80 (w = 0) for
 *               a missing block or row
 * (pe = pairs in the group, 8 except at the end of a row). The bytes are the file's (34 per block),
 * only reordered so that 4 rows stream from memory as one sequential run: the single-token kernel
 * then keeps 4 independent accumulators without reading 4 streams at once, and the scales load as
 * one vector instead of 16 scalars. Results are bit-identical to the unpacked kernels. */

static size_t q8p_group_bytes(int64_t nb) {
    const int64_t np = (nb + 1) / 2, nbg = (nb + 15) / 16;
    return (size_t)(nbg * 128 + np * 256);
}

static size_t avx512_pack_size(const ember_matrix *w) {
    if (w->type != EMBER_TYPE_Q8_0) return 0;
    return (size_t)((w->n_out + 3) / 4) * q8p_group_bytes(w->n_in / EMBER_QK8_0);
}

static void avx512_pack(const ember_matrix *w, void *dst) {
    const int64_t nb = w->n_in / EMBER_QK8_0, np = (nb + 1) / 2;
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    uint8_t *out = dst;
    for (int64_t row0 = 0; row0 < w->n_out; row0 += 4)
        for (int64_t bg = 0; bg * 8 < np; bg++) {
            const int64_t pe = np - bg * 8 < 8 ? np - bg * 8 : 8;
            uint16_t *sc = (uint16_t *)out;
            memset(sc, 0, 128);
            for (int r = 0; r < 4; r++) {
                if (row0 + r >= w->n_out) break;
                const uint8_t *row = (const uint8_t *)w->data + (size_t)(row0 + r) * w->row_bytes;
                for (int i = 0; i < 16 && bg * 16 + i < nb; i++)
                    sc[r * 16 + i] = ember_load_u16(row + (bg * 16 + i) * sizeof(ember_block_q8_0));
            }
            out += 128;
            for (int64_t pi = 0; pi < pe; pi++)
                for (int r = 0; r < 4; r++, out += 64)
                    for (int h = 0; h < 2; h++) {
                        const int64_t b = 2 * (bg * 8 + pi) + h;
                        __m256i q = flip; /* w = 0 */
                        if (row0 + r < w->n_out && b < nb) {
                            const uint8_t *blk = (const uint8_t *)w->data + (size_t)(row0 + r) * w->row_bytes + b * sizeof(ember_block_q8_0);
                            q = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(blk + 2)), flip);
                        }
                        _mm256_store_si256((__m256i *)(out + 32 * h), q);
                    }
        }
}

/* The 4 rows of one packed group times T tokens: out[r*T + t]. Single token: the 16 products
 * d_w * d_x of a block group formed once per row and spread per pair; several: spread then
 * multiplied per (row, token) — the same products either way. Each lane starts from the token's
 * -128 * (sum of its quants) and dpbusd(w + 128, q) ends it at exactly sum w q. */
EMBER_AI void q8p_tile(const uint8_t *grp, const uint8_t *const *xas, int T, int64_t nb, float *out) {
    const int64_t np = (nb + 1) / 2;
    const float *dxs[4];
    const uint8_t *sq[4], *corr[4];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        dxs[t] = (const float *)(xas[t] + q8_off_scales(nb));
        sq[t] = xas[t] + q8_off_signed(nb);
        corr[t] = xas[t] + q8_off_corr(nb);
    }
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) acc[r][t] = _mm512_setzero_ps();
    const uint8_t *blk = grp;
    for (int64_t g = 0; g < np; g += 8) {
        const int pe = np - g < 8 ? (int)(np - g) : 8;
        __m512 dw[4], dx[4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) dw[r] = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(blk + 32 * r)));
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) dx[t] = _mm512_loadu_ps(dxs[t] + 2 * g);
        if (T == 1)
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) dw[r] = _mm512_mul_ps(dw[r], dx[0]);
        const uint8_t *qb = blk + 128;
        for (int pi = 0; pi < pe; pi++, qb += 256) {
            const int64_t p = g + pi;
            __m512 dxp[4];
            if (T > 1)
#pragma GCC unroll 4
                for (int t = 0; t < T; t++) dxp[t] = q8_spread(dx[t], pi);
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) {
                const __m512i w = _mm512_load_si512(qb + 64 * r);
                const __m512 dwp = q8_spread(dw[r], pi);
#pragma GCC unroll 4
                for (int t = 0; t < T; t++) {
                    const __m512i is = _mm512_dpbusd_epi32(_mm512_loadu_si512(corr[t] + p * 64), w, _mm512_loadu_si512(sq[t] + p * 64));
                    const __m512 sc = T == 1 ? dwp : _mm512_mul_ps(dwp, dxp[t]);
                    acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), sc, acc[r][t]);
                }
            }
        }
        blk += 128 + (size_t)pe * 256;
    }
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) out[r * T + t] = reduce512(acc[r][t]);
}

static void q8p_1(const uint8_t *g, const uint8_t *const *x, int64_t nb, float *o) { q8p_tile(g, x, 1, nb, o); }
static void q8p_2(const uint8_t *g, const uint8_t *const *x, int64_t nb, float *o) { q8p_tile(g, x, 2, nb, o); }
static void q8p_3(const uint8_t *g, const uint8_t *const *x, int64_t nb, float *o) { q8p_tile(g, x, 3, nb, o); }
static void q8p_4(const uint8_t *g, const uint8_t *const *x, int64_t nb, float *o) { q8p_tile(g, x, 4, nb, o); }

static void q8p_rows(const ember_matrix *w, const void *xa, size_t xa_stride, float *y, int64_t n_tok, int64_t o0,
                     int64_t o1) {
    static void (*const tile[4])(const uint8_t *, const uint8_t *const *, int64_t, float *) = {q8p_1, q8p_2, q8p_3, q8p_4};
    const int64_t nb = w->n_in / EMBER_QK8_0;
    const size_t gbytes = q8p_group_bytes(nb);
    for (int64_t o = o0; o < o1; o += 4) { /* o0 is a multiple of 4 (the pool's grain is 16) */
        const uint8_t *grp = (const uint8_t *)w->packed + (size_t)(o / 4) * gbytes;
        const int rows = o1 - o < 4 ? (int)(o1 - o) : 4;
        for (int64_t t = 0; t < n_tok; t += 4) {
            const int T = n_tok - t < 4 ? (int)(n_tok - t) : 4;
            const uint8_t *xs[4];
            for (int k = 0; k < T; k++) xs[k] = (const uint8_t *)xa + (size_t)(t + k) * xa_stride;
            float out[16];
            tile[T - 1](grp, xs, nb, out);
            for (int r = 0; r < rows; r++)
                for (int k = 0; k < T; k++) y[(t + k) * w->n_out + o + r] = out[r * T + k];
        }
    }
}

/* ---- tile instances and the row loop ---- */

typedef void (*tile_fn)(const uint8_t *const *rows, const void *const *xs, int64_t n, float *out);

#define TILE_INSTANCES(R, T)                                                                                       \
    static void f32_##R##x##T(const uint8_t *const *rows, const void *const *xs, int64_t n, float *out) {         \
        float_tile(EMBER_TYPE_F32, rows, (const float *const *)xs, R, T, n, out);                                  \
    }                                                                                                              \
    static void f16_##R##x##T(const uint8_t *const *rows, const void *const *xs, int64_t n, float *out) {         \
        float_tile(EMBER_TYPE_F16, rows, (const float *const *)xs, R, T, n, out);                                  \
    }                                                                                                              \
    static void bf16_##R##x##T(const uint8_t *const *rows, const void *const *xs, int64_t n, float *out) {        \
        float_tile(EMBER_TYPE_BF16, rows, (const float *const *)xs, R, T, n, out);                                 \
    }                                                                                                              \
    static void q8_##R##x##T(const uint8_t *const *rows, const void *const *xs, int64_t n, float *out) {          \
        if (R == 1 && T == 1) out[0] = q8_row_token(rows[0], xs[0], n / EMBER_QK8_0);                              \
        else q8_tile(rows, (const uint8_t *const *)xs, R, T, n / EMBER_QK8_0, out);                                \
    }
TILE_INSTANCES(4, 4)
TILE_INSTANCES(4, 3)
TILE_INSTANCES(4, 2)
TILE_INSTANCES(4, 1)
TILE_INSTANCES(1, 4)
TILE_INSTANCES(1, 3)
TILE_INSTANCES(1, 2)
TILE_INSTANCES(1, 1)

/* [type][R == 4 ? 0 : 1][T - 1] */
static const tile_fn tiles[4][2][4] = {
    {{f32_4x1, f32_4x2, f32_4x3, f32_4x4}, {f32_1x1, f32_1x2, f32_1x3, f32_1x4}},
    {{f16_4x1, f16_4x2, f16_4x3, f16_4x4}, {f16_1x1, f16_1x2, f16_1x3, f16_1x4}},
    {{bf16_4x1, bf16_4x2, bf16_4x3, bf16_4x4}, {bf16_1x1, bf16_1x2, bf16_1x3, bf16_1x4}},
    {{q8_4x1, q8_4x2, q8_4x3, q8_4x4}, {q8_1x1, q8_1x2, q8_1x3, q8_1x4}},
};

static int type_index(ember_type t) {
    switch (t) {
    case EMBER_TYPE_F32: return 0;
    case EMBER_TYPE_F16: return 1;
    case EMBER_TYPE_BF16: return 2;
    case EMBER_TYPE_Q8_0: return 3;
    }
    return 0;
}

static size_t avx512_act_size(ember_type type, int64_t n_in) {
    return type == EMBER_TYPE_Q8_0 ? q8_act_size(n_in) : 0;
}

static void avx512_act_prepare(ember_type type, const float *x, void *xa, int64_t n_in) {
    if (type == EMBER_TYPE_Q8_0) q8_prepare(x, xa, n_in);
}

static void avx512_matmul_rows(const ember_matrix *w, const float *x, const void *xa, size_t xa_stride, float *y,
                               int64_t n_tok, int64_t o0, int64_t o1) {
    if (w->packed && w->type == EMBER_TYPE_Q8_0) {
        q8p_rows(w, xa, xa_stride, y, n_tok, o0, o1);
        return;
    }
    const int ti = type_index(w->type);
    const bool q8 = w->type == EMBER_TYPE_Q8_0;
    /* A single token reads each weight once: rows go one at a time, in memory order. Reading
     * several rows interleaved (the 4-row tile) defeats the hardware prefetcher and costs 2-3x
     * bandwidth on the development machine; with several tokens the rows are reused from cache. */
    const int r_main = n_tok == 1 ? 1 : 4;
    for (int64_t o = o0; o < o1;) {
        const int R = o1 - o >= r_main ? r_main : 1;
        const uint8_t *rows[4];
        for (int r = 0; r < R; r++) rows[r] = (const uint8_t *)w->data + (size_t)(o + r) * w->row_bytes;
        for (int64_t t = 0; t < n_tok; t += 4) {
            const int T = n_tok - t >= 4 ? 4 : (int)(n_tok - t);
            const void *xs[4];
            for (int k = 0; k < T; k++)
                xs[k] = q8 ? (const void *)((const uint8_t *)xa + (size_t)(t + k) * xa_stride)
                           : (const void *)(x + (t + k) * w->n_in);
            float out[16];
            tiles[ti][R == 4 ? 0 : 1][T - 1](rows, xs, w->n_in, out);
            for (int r = 0; r < R; r++)
                for (int k = 0; k < T; k++) y[(t + k) * w->n_out + o + r] = out[r * T + k];
        }
        o += R;
    }
}

static void avx512_matmul(const ember_matrix *w, const float *x, float *y, int64_t n_tok) {
    size_t stride = avx512_act_size(w->type, w->n_in);
    uint8_t *xa = NULL;
    if (stride) {
        xa = malloc(stride * (size_t)n_tok);
        if (!xa) abort(); /* single-threaded convenience entry for tests; the engine uses ember_matmul */
        for (int64_t t = 0; t < n_tok; t++) q8_prepare(x + t * w->n_in, xa + (size_t)t * stride, w->n_in);
    }
    avx512_matmul_rows(w, x, xa, stride, y, n_tok, 0, w->n_out);
    free(xa);
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
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(EMBER_LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
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

static void avx512_attn_head(const float *q, const float *k, const float *v, int64_t kv_stride, int64_t n_keys,
                             int64_t hd, float scale, float *scores, float *out) {
    float mx = -INFINITY;
    for (int64_t j = 0; j < n_keys; j++) {
        scores[j] = dot16(q, k + j * kv_stride, hd) * scale;
        mx = scores[j] > mx ? scores[j] : mx;
    }
    /* softmax: e_j = exp(s_j - max), sum in the common order, p_j = e_j / sum */
    const __m512 vmx = _mm512_set1_ps(mx);
    const int64_t n16 = n_keys & ~(int64_t)15;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t j = 0; j < n16; j += 16) {
        __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(scores + j), vmx));
        _mm512_storeu_ps(scores + j, e);
        acc = _mm512_add_ps(acc, e);
    }
    float sum = reduce512(acc);
    for (int64_t j = n16; j < n_keys; j++) {
        scores[j] = ember_s_exp(scores[j] - mx);
        sum += scores[j];
    }
    const __m512 vsum = _mm512_set1_ps(sum);
    for (int64_t j = 0; j < n16; j += 16) _mm512_storeu_ps(scores + j, _mm512_div_ps(_mm512_loadu_ps(scores + j), vsum));
    for (int64_t j = n16; j < n_keys; j++) scores[j] /= sum;
    /* out[d] = sum_j p_j v_j[d], accumulated in j order with fused multiply-adds */
    const int64_t h16 = hd & ~(int64_t)15;
    int64_t d = 0;
    for (; d + 64 <= h16; d += 64) {
        __m512 o0 = _mm512_setzero_ps(), o1 = o0, o2 = o0, o3 = o0;
        for (int64_t j = 0; j < n_keys; j++) {
            const float *vj = v + j * kv_stride + d;
            const __m512 p = _mm512_set1_ps(scores[j]);
            o0 = _mm512_fmadd_ps(p, _mm512_loadu_ps(vj), o0);
            o1 = _mm512_fmadd_ps(p, _mm512_loadu_ps(vj + 16), o1);
            o2 = _mm512_fmadd_ps(p, _mm512_loadu_ps(vj + 32), o2);
            o3 = _mm512_fmadd_ps(p, _mm512_loadu_ps(vj + 48), o3);
        }
        _mm512_storeu_ps(out + d, o0);
        _mm512_storeu_ps(out + d + 16, o1);
        _mm512_storeu_ps(out + d + 32, o2);
        _mm512_storeu_ps(out + d + 48, o3);
    }
    for (; d < h16; d += 16) {
        __m512 o0 = _mm512_setzero_ps();
        for (int64_t j = 0; j < n_keys; j++)
            o0 = _mm512_fmadd_ps(_mm512_set1_ps(scores[j]), _mm512_loadu_ps(v + j * kv_stride + d), o0);
        _mm512_storeu_ps(out + d, o0);
    }
    for (; d < hd; d++) {
        float o = 0.0f;
        for (int64_t j = 0; j < n_keys; j++) o = fmaf(scores[j], v[j * kv_stride + d], o);
        out[d] = o;
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
    .matmul = avx512_matmul,
    .dot_f32 = avx512_dot_f32,
    .act_size = avx512_act_size,
    .act_prepare = avx512_act_prepare,
    .matmul_rows = avx512_matmul_rows,
    .attn_head = avx512_attn_head,
    .rmsnorm = avx512_rmsnorm,
    .silu_mul = avx512_silu_mul,
    .gelu_mul = avx512_gelu_mul,
    .rope_heads = ember_rope_heads_fast,
    .pack_size = avx512_pack_size,
    .pack = avx512_pack,
};
