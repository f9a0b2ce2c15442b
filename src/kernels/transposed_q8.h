/* transposed_q8.h — the fast transposed product of Q8_0 weights, dx = g W, that avx2.c and avx512.c
 * share: integer dot products of the weights' own int8 quants with the gradient quantized to int8,
 * in the order kernels.h gives ("the fast Q8_0 transposed product"). The integer sums are exact and
 * every float step is one elementwise IEEE operation, so the two sets are bit-identical.
 * Include only from files compiled with -ffp-contract=off, after defining:
 *   TQ_FLIP        the byte xor-ed into every weight quant of the panel (0, or 0x80 for u8 quants)
 *   tq_isums(p, ps, hq, nq, hsum, out)  out[c] = sum over r < 4 nq of hq[r] * q[r][c] for the 32
 *                  columns of one block, p the panel of that block (quads, ps bytes apart),
 *                  hsum = sum of hq. */
#ifndef EMBER_TRANSPOSED_Q8_H
#define EMBER_TRANSPOSED_Q8_H

#include "simd_common.h"

#include <float.h>

/* Columns of one panel (eight Q8_0 blocks: ember_matmul_t_panel's) and the bytes of a quad row. */
#define TQ_COLS 256
#define TQ_BLOCKS (TQ_COLS / EMBER_QK8_0)
#define TQ_STRIDE (TQ_COLS * 4)

/* The panel of rows [o0, o0 + nr) and columns [c0, c0 + cw) (cw a multiple of 32): quad row r4 holds, per
 * column c, the quants of rows o0 + 4 r4 .. + 3 (zeros past nr), xor TQ_FLIP; d[b][r] the scale of
 * row o0 + r's block b (zeros past nr). */
EMBER_AI void tq_panel(const ember_matrix *w, int64_t o0, int64_t nr, int64_t c0, int64_t cw, uint8_t *panel,
                       float d[TQ_BLOCKS][EMBER_MATMUL_T_CHUNK]) {
    const __m128i flip = _mm_set1_epi8((char)TQ_FLIP), zero = _mm_setzero_si128();
    const int64_t nq = (nr + 3) / 4;
    for (int64_t b = 0; b < cw / EMBER_QK8_0; b++)
        for (int64_t r = 0; r < 4 * nq; r++) {
            const uint8_t *blk = (const uint8_t *)w->data + (size_t)(o0 + r) * w->row_bytes +
                                 (size_t)(c0 / EMBER_QK8_0 + b) * sizeof(ember_block_q8_0);
            d[b][r] = r < nr ? ember_h2f(ember_load_u16(blk)) : 0.0f;
        }
    for (int64_t r4 = 0; r4 < nq; r4++)
        for (int64_t c = 0; c < cw; c += 16) {
            __m128i v[4];
            for (int k = 0; k < 4; k++) {
                const int64_t o = o0 + 4 * r4 + k;
                const uint8_t *q = (const uint8_t *)w->data + (size_t)o * w->row_bytes +
                                   (size_t)((c0 + c) / EMBER_QK8_0) * sizeof(ember_block_q8_0) + 2 + (c0 + c) % 32;
                v[k] = 4 * r4 + k < nr ? _mm_loadu_si128((const __m128i *)q) : zero;
            }
            const __m128i ab0 = _mm_unpacklo_epi8(v[0], v[1]), ab1 = _mm_unpackhi_epi8(v[0], v[1]);
            const __m128i cd0 = _mm_unpacklo_epi8(v[2], v[3]), cd1 = _mm_unpackhi_epi8(v[2], v[3]);
            uint8_t *out = panel + r4 * TQ_STRIDE + c * 4;
            _mm_storeu_si128((__m128i *)out, _mm_xor_si128(_mm_unpacklo_epi16(ab0, cd0), flip));
            _mm_storeu_si128((__m128i *)(out + 16), _mm_xor_si128(_mm_unpackhi_epi16(ab0, cd0), flip));
            _mm_storeu_si128((__m128i *)(out + 32), _mm_xor_si128(_mm_unpacklo_epi16(ab1, cd1), flip));
            _mm_storeu_si128((__m128i *)(out + 48), _mm_xor_si128(_mm_unpackhi_epi16(ab1, cd1), flip));
        }
}

/* The panel's bytes of the chunk of rows from o0 (the next one), asked of the memory early: each
 * row of a panel is a different stream, more than the hardware prefetchers follow. */
EMBER_AI void tq_prefetch(const ember_matrix *w, int64_t o0, int64_t c0, int64_t cw) {
    const int64_t o1 = w->n_out - o0 < EMBER_MATMUL_T_CHUNK ? w->n_out : o0 + EMBER_MATMUL_T_CHUNK;
    const size_t bytes = (size_t)(cw / EMBER_QK8_0) * sizeof(ember_block_q8_0);
    for (int64_t o = o0; o < o1; o++) {
        const char *p =
            (const char *)w->data + (size_t)o * w->row_bytes + (size_t)(c0 / EMBER_QK8_0) * sizeof(ember_block_q8_0);
        for (size_t off = 0; off < bytes; off += 64) _mm_prefetch(p + off, _MM_HINT_T1);
        _mm_prefetch(p + bytes - 1, _MM_HINT_T1); /* the last line, when the bytes straddle one more */
    }
}

/* 32 int32 lanes -> 32 int8 in order (values already within [-127, 127]). */
EMBER_AI __m256i tq_pack(__m256i a, __m256i b, __m256i c, __m256i d) {
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
    return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* h[r] = g[r] * d[r] for the chunk's 64 rows (zeros past the chunk), quantized: s = amax / 127,
 * hq[r] = rint(h[r] * (127 / amax)); a chunk with amax below 2^-120 is zero (s = 0), a non-finite
 * one gives s = NaN (so its outputs are NaN). Returns s; *hsum = sum of hq. */
EMBER_AI float tq_quantize(const float *g, const float *d, int8_t *hq, int32_t *hsum) {
    __m256 h[8];
    __m256i m = _mm256_setzero_si256();
    const __m256i abs_bits = _mm256_set1_epi32(0x7fffffff);
    for (int k = 0; k < 8; k++) {
        h[k] = _mm256_mul_ps(_mm256_loadu_ps(g + 8 * k), _mm256_loadu_ps(d + 8 * k));
        m = _mm256_max_epu32(m, _mm256_and_si256(_mm256_castps_si256(h[k]), abs_bits));
    }
    __m128i m4 = _mm_max_epu32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
    m4 = _mm_max_epu32(m4, _mm_shuffle_epi32(m4, 0x4e));
    m4 = _mm_max_epu32(m4, _mm_shuffle_epi32(m4, 0xb1));
    const float amax = _mm_cvtss_f32(_mm_castsi128_ps(m4));
    float s = 0.0f, inv = 0.0f;
    if (!(amax <= FLT_MAX)) s = amax - amax; /* inf or NaN: NaN */
    else if (amax >= 0x1p-120f) {
        s = amax / 127.0f;
        inv = 127.0f / amax;
    }
    const __m256 iv = _mm256_set1_ps(inv);
    __m256i q[8], sum = _mm256_setzero_si256();
    for (int k = 0; k < 8; k++) {
        q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(h[k], iv)); /* round to nearest even */
        sum = _mm256_add_epi32(sum, q[k]);
    }
    _mm256_storeu_si256((__m256i *)hq, tq_pack(q[0], q[1], q[2], q[3]));
    _mm256_storeu_si256((__m256i *)(hq + 32), tq_pack(q[4], q[5], q[6], q[7]));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
    *hsum = _mm_cvtsi128_si32(s4);
    return s;
}

/* dx[c] = s * isum[c] (the first chunk) or dx[c] + s * isum[c], for one block's 32 columns. */
EMBER_AI void tq_fold(float *dx, const int32_t *isum, float s, bool first) {
    const __m256 sv = _mm256_set1_ps(s);
    for (int k = 0; k < 4; k++) {
        const __m256 part = _mm256_mul_ps(sv, _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(isum + 8 * k))));
        _mm256_storeu_ps(dx + 8 * k, first ? part : _mm256_add_ps(_mm256_loadu_ps(dx + 8 * k), part));
    }
}

/* Columns [i0, i1) of dx = g W for Q8_0 (i0, i1 multiples of 32): panels of 256 columns, each chunk
 * of 64 rows interleaved once and shared by every token. */
static void tq_rows_q8_0(const ember_matrix *w, const float *g, float *dx, int64_t n_tok, int64_t i0, int64_t i1) {
    uint8_t panel[EMBER_MATMUL_T_CHUNK / 4 * TQ_STRIDE] __attribute__((aligned(64)));
    float d[TQ_BLOCKS][EMBER_MATMUL_T_CHUNK] __attribute__((aligned(32)));
    float gb[EMBER_MATMUL_T_CHUNK] __attribute__((aligned(32)));
    int8_t hq[EMBER_MATMUL_T_CHUNK] __attribute__((aligned(32)));
    int32_t isum[EMBER_QK8_0] __attribute__((aligned(32)));
    for (int64_t c0 = i0; c0 < i1; c0 += TQ_COLS) {
        const int64_t cw = i1 - c0 < TQ_COLS ? i1 - c0 : TQ_COLS;
        for (int64_t o0 = 0; o0 < w->n_out; o0 += EMBER_MATMUL_T_CHUNK) {
            const int64_t nr = w->n_out - o0 < EMBER_MATMUL_T_CHUNK ? w->n_out - o0 : EMBER_MATMUL_T_CHUNK;
            const int64_t nq = (nr + 3) / 4;
            tq_prefetch(w, o0 + EMBER_MATMUL_T_CHUNK, c0, cw);
            tq_panel(w, o0, nr, c0, cw, panel, d);
            for (int64_t r = nr; r < EMBER_MATMUL_T_CHUNK; r++) {
                gb[r] = 0.0f;
                for (int64_t b = 0; b < TQ_BLOCKS; b++) d[b][r] = 0.0f;
            }
            for (int64_t t = 0; t < n_tok; t++) {
                const float *gt = g + t * w->n_out + o0;
                if (nr < EMBER_MATMUL_T_CHUNK) { /* the last chunk: zeros past it */
                    for (int64_t r = 0; r < nr; r++) gb[r] = gt[r];
                    gt = gb;
                }
                for (int64_t b = 0; b < cw / EMBER_QK8_0; b++) {
                    int32_t hsum;
                    const float s = tq_quantize(gt, d[b], hq, &hsum);
                    tq_isums(panel + b * EMBER_QK8_0 * 4, TQ_STRIDE, hq, nq, hsum, isum);
                    tq_fold(dx + t * w->n_in + c0 + b * EMBER_QK8_0, isum, s, o0 == 0);
                }
            }
        }
    }
}

#endif
