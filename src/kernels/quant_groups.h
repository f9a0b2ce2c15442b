/* quant_groups.h — the 4-row interleaved layouts of the 4- to 6-bit weight types (Q4_0, Q4_1,
 * Q5_0, Q5_1, Q4_K, Q5_K, Q6_K; repacked once at load, still compressed) and their kernels, shared
 * by avx2.c and avx512.c.
 *
 * Why: a row-at-a-time kernel spends its instructions unpacking one row's nibbles and reducing
 * one row's sums; with 4 rows side by side, one 32-byte vector holds 4 bytes of each of 8
 * (row, sub-block) pairs, every integer lane accumulates a whole (sub-)block before any reduction,
 * and the activation side is one 16-byte broadcast shared by all rows (as Q8_0's groups,
 * q8_groups.h). The integers are the same exact sums as the row kernels' (quant_dots.h), and the
 * f32 operations are the documented order of each type unchanged, so a group kernel and a row
 * kernel give the same bits; which instructions produce the integers is the only per-set part:
 * avx512.c (VNNI) uses vpdpbusd, avx2.c vpmaddubsw + vpmaddwd.
 *
 * Register halves: every 64-byte step is two 256-bit vectors, rows 0-1 and rows 2-3; in a half,
 * 32-bit lane l belongs to row 2h + l / 4, and each 128-bit half of it to one row. */
#ifndef EMBER_QUANT_GROUPS_H
#define EMBER_QUANT_GROUPS_H

#include "q8_groups.h"
#include "quants.h"

/* Tokens one group kernel call multiplies (the group is unpacked once for all of them). The Q4_K
 * row loop uses tiles of 2 on AVX2: its 16-bit sums of 4 tokens would not fit in the 16 registers
 * and a second pass over the group (tokens 3-4, read from L1) costs less than the spills; the other
 * types, and every type on AVX-512 (32 registers), use tiles of 4. */
#define QG_MAX_T 4
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define QG_TILE_4K 4
#else
#define QG_TILE_4K 2
#endif

/* acc + the exact sums of 4 products u8 x s8 per int32 lane (u <= 63 here: no saturation). */
EMBER_AI __m256i qg_dot(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(acc, u, s);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

EMBER_AI __m256i qg_bcast16(const uint8_t *p) {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
}

/* Row sums of two halves (8 lanes each, 4 per row): [row 0, row 1, row 2, row 3]. Exact. */
EMBER_AI __m128i qg_rowsum(__m256i h0, __m256i h1) {
    const __m256i a = _mm256_hadd_epi32(h0, h1); /* [r0 r0 r2 r2 | r1 r1 r3 r3] partials */
    const __m256i b = _mm256_hadd_epi32(a, a);   /* [r0 r2 r0 r2 | r1 r3 r1 r3] */
    return _mm_unpacklo_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
}

/* Stores the first `rows` of 4 results. */
EMBER_AI void qg_store(float *y, __m128 v, int rows) {
    if (rows == 4) {
        _mm_storeu_ps(y, v);
        return;
    }
    float l[4];
    _mm_storeu_ps(l, v);
    for (int r = 0; r < rows; r++) y[r] = l[r];
}

/* One group kernel call: a whole 4-row group g times T tokens; writes y[t * n_out + r], r < rows. */
typedef void (*qg_kernel_fn)(const uint8_t *g, const uint8_t *const *xs, int64_t nb, float *y, int64_t n_out, int rows);

/* Rows [o0, o1) (o0 a multiple of 4) of repacked weights, tokens t_max at a time; the group is the
 * outer loop so its bytes stay in L1 across every token tile. */
static void qg_rows(const qg_kernel_fn *kern, int t_max, size_t group_bytes, int64_t nb, const ember_matrix *w,
                    const void *xa, size_t xa_stride, float *y, int64_t n_tok, int64_t o0, int64_t o1) {
    if (n_tok > EMBER_MATMUL_MAX_TOKENS) { /* callers slice longer runs; stay in bounds if one does not */
        for (int64_t t0 = 0; t0 < n_tok; t0 += EMBER_MATMUL_MAX_TOKENS)
            qg_rows(kern, t_max, group_bytes, nb, w, (const uint8_t *)xa + (size_t)t0 * xa_stride, xa_stride,
                    y + t0 * w->n_out, n_tok - t0 < EMBER_MATMUL_MAX_TOKENS ? n_tok - t0 : EMBER_MATMUL_MAX_TOKENS, o0,
                    o1);
        return;
    }
    const uint8_t *xs[EMBER_MATMUL_MAX_TOKENS];
    const int64_t nt = n_tok;
    for (int64_t t = 0; t < nt; t++) xs[t] = (const uint8_t *)xa + (size_t)t * xa_stride;
    for (int64_t o = o0; o < o1; o += 4) {
        const int rows = o1 - o < 4 ? (int)(o1 - o) : 4;
        const uint8_t *g = (const uint8_t *)w->packed + (size_t)(o / 4) * group_bytes;
        for (int64_t t = 0; t < nt; t += t_max) {
            const int T = nt - t < t_max ? (int)(nt - t) : t_max;
            kern[T - 1](g, xs + t, nb, y + t * w->n_out + o, w->n_out, rows);
        }
    }
}

/* ======================== Q4_0, Q4_1, Q5_0, Q5_1 x Q8_0 / Q8_1 ========================
 * Group layout: quads of 4 blocks (a row's blocks padded with zero blocks to a multiple of 4; rows
 * past n_out are zeros); one quad is 288 (Q4_0), 320 (Q4_1), 352 (Q5_0) or 384 (Q5_1) bytes, the
 * file's 18 / 20 / 22 / 24 per block:
 *     [0, 32)        16 f16 scales: entry r*4 + j = d of row r, block 4Q + j
 *     [32, 64)       (Q4_1, Q5_1) the f16 minimums m, same entries
 *     then 256 bytes step k = 0..3: 64 bytes, entry (r*4 + j)*4 + i = qs[4k + i] of row r, block 4Q + j
 *     then (Q5_0, Q5_1) 64 bytes, entry (r*4 + j)*4 + i: bit 2k = the fifth bit of quant 4k + i,
 *                    bit 2k + 1 = of quant 16 + 4k + i (k = 0..3)
 * Byte qs[l] holds quant l (low nibble) and quant l + 16 (high nibble), so step k's low nibbles
 * meet Q8_0 activation step k and its high nibbles step k + 4 (q8_groups.h's activation layout,
 * unchanged). Lanes start from -o * sum y = (-128 * sum y) >> 4 (o = 8, Q4_0) or >> 3 (o = 16,
 * Q5_0), exact, so each holds the block's isum exactly; then Q8_0's order: lane (r, j) is p_j of
 * row r, and (Q4_1, Q5_1) after each block's term p_j = fma(m_w, s_x, p_j). */
typedef enum { QG_Q4_0, QG_Q4_1, QG_Q5_0, QG_Q5_1 } qg_kind;

EMBER_AI bool qg32_five(qg_kind k) { return k == QG_Q5_0 || k == QG_Q5_1; }
EMBER_AI bool qg32_has_m(qg_kind k) { return k == QG_Q4_1 || k == QG_Q5_1; }
EMBER_AI size_t qg32_off_qs(qg_kind k) { return qg32_has_m(k) ? 64 : 32; }
EMBER_AI size_t qg32_quad_bytes(qg_kind k) { return qg32_off_qs(k) + 256 + (qg32_five(k) ? 64 : 0); }
EMBER_AI int64_t qg32_quads(int64_t nb) { return (nb + 3) / 4; }
EMBER_AI size_t qg32_group_bytes(qg_kind k, int64_t nb) { return (size_t)qg32_quads(nb) * qg32_quad_bytes(k); }

static size_t qg32_pack_size(qg_kind kind, const ember_matrix *w) {
    return (size_t)((w->n_out + 3) / 4) * qg32_group_bytes(kind, w->n_in / 32);
}

static void qg32_pack(qg_kind kind, const ember_matrix *w, void *dst) {
    const bool five = qg32_five(kind), has_m = qg32_has_m(kind);
    const int64_t nb = w->n_in / 32, nq = qg32_quads(nb);
    const size_t oq = qg32_off_qs(kind), qb = qg32_quad_bytes(kind);
    /* in the file's block: d at 0, m at 2, qh (u32) after them, qs (16 bytes) last */
    const size_t bbytes = (size_t)(2 + (has_m ? 2 : 0) + (five ? 4 : 0) + 16), fqh = has_m ? 4 : 2, fqs = bbytes - 16;
    /* a weight of 0 in padding: quant 8 (Q4_0), 16 (Q5_0: nibble 0, fifth bit 1), 0 otherwise */
    const uint8_t pad_qs = kind == QG_Q4_0 ? 0x88 : 0x00, pad_qh = kind == QG_Q5_0 ? 0xFF : 0x00;
    uint8_t *d = dst;
    for (int64_t row0 = 0; row0 < w->n_out; row0 += 4)
        for (int64_t qd = 0; qd < nq; qd++, d += qb) {
            memset(d, 0, oq); /* scale (and minimum) 0 for missing rows and blocks */
            memset(d + oq, pad_qs, 256);
            if (five) memset(d + oq + 256, pad_qh, 64);
            for (int r = 0; r < 4 && row0 + r < w->n_out; r++) {
                const uint8_t *row = (const uint8_t *)w->data + (size_t)(row0 + r) * w->row_bytes;
                for (int j = 0; j < 4 && 4 * qd + j < nb; j++) {
                    const uint8_t *blk = row + (size_t)(4 * qd + j) * bbytes;
                    const int e = (r * 4 + j) * 4;
                    memcpy(d + 2 * (r * 4 + j), blk, 2);
                    if (has_m) memcpy(d + 32 + 2 * (r * 4 + j), blk + 2, 2);
                    for (int k = 0; k < 4; k++) memcpy(d + oq + 64 * k + e, blk + fqs + 4 * k, 4);
                    if (five) {
                        uint32_t qh;
                        memcpy(&qh, blk + fqh, 4);
                        for (int i = 0; i < 4; i++) {
                            uint8_t v = 0;
                            for (int k = 0; k < 4; k++)
                                v |= (uint8_t)(((qh >> (4 * k + i)) & 1) << (2 * k) | ((qh >> (16 + 4 * k + i)) & 1)
                                                                                          << (2 * k + 1));
                            d[oq + 256 + e + i] = v;
                        }
                    }
                }
            }
        }
}

/* (v << s) for s in [-3, 4] on 16-bit lanes (a negative s shifts right); callers mask one bit per byte. */
EMBER_AI __m256i qg_shift16(__m256i v, int s) { return s >= 0 ? _mm256_slli_epi16(v, s) : _mm256_srli_epi16(v, -s); }

/* The integer part of one quad qd of a 32-value group for T tokens: acc[t][h] lane (r, j) = the
 * exact isum of row 2h + r's block 4 qd + j (g points at the quad). */
EMBER_AI void qg32_ints(qg_kind kind, const uint8_t *g, const uint8_t *const *xs, int T, int64_t nb, int64_t qd,
                        __m256i acc[QG_MAX_T][2]) {
    const bool five = qg32_five(kind);
    const size_t ocorr = q8g_off_corr(nb), oq = qg32_off_qs(kind);
    const __m256i low4 = _mm256_set1_epi8(0x0F), bit4 = _mm256_set1_epi8(0x10);
#if !(defined(__AVX512VNNI__) && defined(__AVX512VL__))
    const int run = five ? 2 : 4;
    __m256i s16[QG_MAX_T][2];
#endif
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        const __m256i corr = qg_bcast16(xs[t] + ocorr + 16 * qd); /* -128 * sum y per block */
        acc[t][0] = acc[t][1] = kind == QG_Q4_0   ? _mm256_srai_epi32(corr, 4)
                                : kind == QG_Q5_0 ? _mm256_srai_epi32(corr, 3)
                                                  : _mm256_setzero_si256();
    }
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        __m256i lo[2], hi[2];
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(g + oq + 64 * k + 32 * h));
            lo[h] = _mm256_and_si256(v, low4);
            hi[h] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
            if (five) {
                const __m256i qh = _mm256_loadu_si256((const __m256i *)(g + oq + 256 + 32 * h));
                lo[h] = _mm256_or_si256(lo[h], _mm256_and_si256(qg_shift16(qh, 4 - 2 * k), bit4));
                hi[h] = _mm256_or_si256(hi[h], _mm256_and_si256(qg_shift16(qh, 3 - 2 * k), bit4));
            }
        }
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            const __m256i ylo = qg_bcast16(xs[t] + 128 * qd + 16 * k),
                          yhi = qg_bcast16(xs[t] + 128 * qd + 16 * (k + 4));
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
                acc[t][h] = qg_dot(qg_dot(acc[t][h], lo[h], ylo), hi[h], yhi);
#else
                /* the two pair sums of a step (each <= 2 * 31 * 127) added in 16 bits over a run
                 * of steps: 4 for 4-bit quants (<= 30480), 2 for 5-bit ones (<= 31496) */
                const __m256i pr = _mm256_add_epi16(_mm256_maddubs_epi16(lo[h], ylo), _mm256_maddubs_epi16(hi[h], yhi));
                s16[t][h] = k % run == 0 ? pr : _mm256_add_epi16(s16[t][h], pr);
                ember_pin256(&s16[t][h]);
                if (k % run == run - 1) {
                    acc[t][h] = _mm256_add_epi32(acc[t][h], _mm256_madd_epi16(s16[t][h], _mm256_set1_epi16(1)));
                    ember_pin256(&acc[t][h]);
                }
#endif
            }
        }
    }
}

EMBER_AI void qg32_group(qg_kind kind, const uint8_t *g, const uint8_t *const *xs, int T, int64_t nb, float *y,
                         int64_t n_out, int rows) {
    const bool has_m = qg32_has_m(kind);
    const size_t odx = q8g_off_dx(nb), osx = (size_t)q8g_spans(nb) * Q8G_SPAN_BLOCKS * 72, qb = qg32_quad_bytes(kind);
    __m256 p[QG_MAX_T][2];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) p[t][0] = p[t][1] = _mm256_setzero_ps();
    const int64_t nq = qg32_quads(nb);
    for (int64_t qd = 0; qd < nq; qd++, g += qb) {
        __m256i acc[QG_MAX_T][2];
        qg32_ints(kind, g, xs, T, nb, qd, acc);
        const __m256 dw0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)g));
        const __m256 dw1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g + 16)));
        const __m256 mw0 = has_m ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g + 32))) : _mm256_setzero_ps();
        const __m256 mw1 = has_m ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g + 48))) : _mm256_setzero_ps();
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            const __m256 dx = _mm256_broadcast_ps((const __m128 *)((const float *)(xs[t] + odx) + 4 * qd));
            p[t][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[t][0]), _mm256_mul_ps(dw0, dx), p[t][0]);
            p[t][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[t][1]), _mm256_mul_ps(dw1, dx), p[t][1]);
            if (has_m) {
                const __m256 sx = _mm256_broadcast_ps((const __m128 *)((const float *)(xs[t] + osx) + 4 * qd));
                p[t][0] = _mm256_fmadd_ps(mw0, sx, p[t][0]);
                p[t][1] = _mm256_fmadd_ps(mw1, sx, p[t][1]);
            }
        }
    }
    /* (p0 + p1) + (p2 + p3) in every 128-bit half (one row each) */
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        __m256 s[2];
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m256 pairs = _mm256_add_ps(p[t][h], _mm256_permute_ps(p[t][h], 0xB1));
            s[h] = _mm256_add_ps(pairs, _mm256_permute_ps(pairs, 0x4E));
        }
        /* lane 0 of each 128-bit half: rows 0, 1 (s[0]) and 2, 3 (s[1]) */
        const __m256 u = _mm256_shuffle_ps(s[0], s[1], 0x00); /* [r0 r0 r2 r2 | r1 r1 r3 r3] */
        const __m128 out =
            _mm_unpacklo_ps(_mm_shuffle_ps(_mm256_castps256_ps128(u), _mm256_castps256_ps128(u), 0x08),
                            _mm_shuffle_ps(_mm256_extractf128_ps(u, 1), _mm256_extractf128_ps(u, 1), 0x08));
        qg_store(y + t * n_out, out, rows);
    }
}

#define QG32_PACK_FNS(suffix, kind)                                                                                    \
    static size_t qg_pack_size_##suffix(const ember_matrix *w) { return qg32_pack_size(kind, w); }                     \
    static void qg_pack_##suffix(const ember_matrix *w, void *dst) { qg32_pack(kind, w, dst); }
QG32_PACK_FNS(q4_0, QG_Q4_0)
QG32_PACK_FNS(q4_1, QG_Q4_1)
QG32_PACK_FNS(q5_0, QG_Q5_0)
QG32_PACK_FNS(q5_1, QG_Q5_1)

/* ======================== Q4_K, Q5_K x Q8_K ========================
 * Group layout: per super-block b, 592 bytes (Q4_K) or 720 (Q5_K):
 *     [0, 512)    step k = 0..7: 64 bytes, entry (r*4 + c)*4 + i = qs[32c + 4k + i] of row r
 *     [512, 640)  (Q5_K) n = 0..1: 64 bytes, entry (r*4 + c)*4 + i: bits 2l, 2l + 1 = bits 2c,
 *                 2c + 1 of qh[4k + i], k = n + 2l (the fifth bits of values 64c + 4k + i and
 *                 64c + 32 + 4k + i)
 *     then 32 bytes: the 6-bit sub-block scales, unpacked: entry r*8 + j = sc_j of row r
 *     then 32 bytes: the 6-bit minimums: entry r*8 + j = mn_j of row r
 *     then 8 bytes d of rows 0-3 (f16), 8 bytes dmin of rows 0-3 (f16)
 * Byte qs[32c + l] holds value 64c + l (low nibble, sub-block 2c) and 64c + 32 + l (high nibble,
 * sub-block 2c + 1). So lane (r, c) of step k's low nibbles accumulates sub-block 2c of row r,
 * the high nibbles sub-block 2c + 1, and after 8 steps each lane holds one sub-block's exact sum.
 * A_b = sum of sc x those sums, B_b = sum_j mn_j * bsum32_j, then the documented order.
 *
 * Prepared activations of one token: per super-block 288 bytes (the Q8_K block's values, reordered)
 *     [0, 256)    step k: 16 bytes y[64c + 4k + i] (entry c*4 + i), then 16 bytes y[64c + 32 + 4k + i]
 *     [256, 272)  int16 bsum32_j = sum of the 32 quants of sub-block j, j = 0..7
 *     [272, 276)  d (f32); [276, 288) zero
 * followed by the Q8_K blocks themselves (for the row kernels, which read weights in place). */
#define QG4K_SB_BYTES 592
#define QG5K_SB_BYTES 720
EMBER_AI size_t qgk_sb_bytes(bool five) { return five ? QG5K_SB_BYTES : QG4K_SB_BYTES; }
EMBER_AI size_t qgk_off_sc(bool five) { return five ? 640 : 512; }
#define QG4K_ACT_BYTES 288

/* ---- Q8_K activations: one block of 256 values, as the oracle ember_quantize_act_q8_k writes it
 * (bit for bit: the same f32 operations on every value, the max found the same way), and the
 * 4 x 4 transposes of 4-byte groups the layouts below are made of. */
EMBER_AI void qg_q8k_block(const float *x, ember_block_q8_K *o) {
    const __m256 nosign = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), inf = _mm256_set1_ps(INFINITY);
    __m256 mx = _mm256_setzero_ps();
    int bad = 0;
    for (int i = 0; i < EMBER_QK_K; i += 8) {
        const __m256 a = _mm256_and_ps(_mm256_loadu_ps(x + i), nosign);
        bad |= _mm256_movemask_ps(_mm256_cmp_ps(a, inf, _CMP_NLT_UQ)); /* NaN or infinity */
        mx = _mm256_max_ps(mx, a);
    }
    memset(o, 0, sizeof *o);
    if (bad) { /* the oracle's non-finite block: d = NaN, quants and sums 0 */
        o->d = NAN;
        return;
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4); /* exact in any order */
    if (amax == 0.0f) return;
    int j = 0; /* the first value of largest magnitude, with its sign */
    for (int i = 0; i < EMBER_QK_K; i += 8) {
        const int eq = _mm256_movemask_ps(
            _mm256_cmp_ps(_mm256_and_ps(_mm256_loadu_ps(x + i), nosign), _mm256_set1_ps(amax), _CMP_EQ_OQ));
        if (eq) {
            j = i + __builtin_ctz((unsigned)eq);
            break;
        }
    }
    const float iscale = -127.f / x[j];
    const __m256 vs = _mm256_set1_ps(iscale), magic = _mm256_set1_ps(12582912.f); /* 1.5 * 2^23 */
    const __m256i mant = _mm256_set1_epi32(0x007fffff), half = _mm256_set1_epi32(0x00400000);
    const __m256i top = _mm256_set1_epi32(127), perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    __m128i sums[4];
    for (int c = 0; c < 8; c++) { /* 32 values: 4 vectors of 8 */
        __m256i q[4];
        for (int k = 0; k < 4; k++) { /* round_nearest(iscale * x), min(127, .), then C's int8 conversion
                                        * (the low byte: only an infinite iscale, from a subnormal
                                        * maximum, gets values outside [-128, 127]) */
            const __m256 t = _mm256_add_ps(_mm256_mul_ps(vs, _mm256_loadu_ps(x + 32 * c + 8 * k)), magic);
            const __m256i r =
                _mm256_min_epi32(_mm256_sub_epi32(_mm256_and_si256(_mm256_castps_si256(t), mant), half), top);
            q[k] = _mm256_srai_epi32(_mm256_slli_epi32(r, 24), 24);
        }
        const __m256i b8 = _mm256_permutevar8x32_epi32(
            _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3])), perm);
        _mm256_storeu_si256((__m256i *)(o->qs + 32 * c), b8);
        /* the sums of 16 (values 32c .. 32c + 15 and + 16 .. 31), exact in int32 */
        const __m256i h = _mm256_hadd_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        const __m256i hh = _mm256_hadd_epi32(h, h); /* [s0 s1 s0 s1 | s0' s1' ...] per 128-bit half */
        const __m128i s2 = _mm_add_epi32(_mm256_castsi256_si128(hh), _mm256_extracti128_si256(hh, 1));
        sums[c / 2] = c % 2 ? _mm_unpacklo_epi64(sums[c / 2], s2) : s2;
    }
    _mm_storeu_si128((__m128i *)o->bsums, _mm_packs_epi32(sums[0], sums[1]));
    _mm_storeu_si128((__m128i *)(o->bsums + 8), _mm_packs_epi32(sums[2], sums[3]));
    o->d = 1 / iscale;
}

/* dst + k * stride (k = 0..3) = the 4-byte group k of each of the 16-byte rows r0..r3, in row order */
EMBER_AI void qg_transpose4x4(const uint8_t *r0, const uint8_t *r1, const uint8_t *r2, const uint8_t *r3, uint8_t *dst,
                              size_t stride) {
    const __m128i a = _mm_loadu_si128((const __m128i *)r0), b = _mm_loadu_si128((const __m128i *)r1);
    const __m128i c = _mm_loadu_si128((const __m128i *)r2), d = _mm_loadu_si128((const __m128i *)r3);
    const __m128i ab0 = _mm_unpacklo_epi32(a, b), ab1 = _mm_unpackhi_epi32(a, b);
    const __m128i cd0 = _mm_unpacklo_epi32(c, d), cd1 = _mm_unpackhi_epi32(c, d);
    _mm_storeu_si128((__m128i *)dst, _mm_unpacklo_epi64(ab0, cd0));
    _mm_storeu_si128((__m128i *)(dst + stride), _mm_unpackhi_epi64(ab0, cd0));
    _mm_storeu_si128((__m128i *)(dst + 2 * stride), _mm_unpacklo_epi64(ab1, cd1));
    _mm_storeu_si128((__m128i *)(dst + 3 * stride), _mm_unpackhi_epi64(ab1, cd1));
}

static size_t qg4k_act_size(int64_t n_in) {
    return (size_t)(n_in / EMBER_QK_K) * (QG4K_ACT_BYTES + sizeof(ember_block_q8_K));
}
EMBER_AI size_t qg4k_off_q8k(int64_t nb) { return (size_t)nb * QG4K_ACT_BYTES; }

static void qg4k_act_prepare(const float *x, void *xa, int64_t n_in) {
    const int64_t nb = n_in / EMBER_QK_K;
    uint8_t *o = xa;
    ember_block_q8_K *q = (ember_block_q8_K *)(o + qg4k_off_q8k(nb));
    for (int64_t b = 0; b < nb; b++, o += QG4K_ACT_BYTES) {
        const ember_block_q8_K *y = &q[b];
        qg_q8k_block(x + b * EMBER_QK_K, &q[b]);
        /* step k: y[64c + 4k + i] (c = 0..3), then y[64c + 32 + 4k + i] */
        for (int half = 0; half < 4; half++) { /* bytes 16 * half of each chunk: steps 4 (half % 2) .. + 3 */
            const uint8_t *r = (const uint8_t *)y->qs + 16 * half;
            qg_transpose4x4(r, r + 64, r + 128, r + 192, o + 32 * 4 * (half % 2) + 16 * (half / 2), 32);
        }
        int16_t bs[8];
        for (int j = 0; j < 8; j++) bs[j] = (int16_t)(y->bsums[2 * j] + y->bsums[2 * j + 1]);
        memcpy(o + 256, bs, 16);
        memcpy(o + 272, &y->d, 4);
        memset(o + 276, 0, 12);
    }
}

static size_t qgk_pack_size(bool five, const ember_matrix *w) {
    return (size_t)((w->n_out + 3) / 4) * (size_t)(w->n_in / EMBER_QK_K) * qgk_sb_bytes(five);
}

/* sub-block j's 6-bit scale and minimum from the 12 packed bytes (ggml's layout) */
static void qg_k4_scale_min(const uint8_t *s, int j, uint8_t *sc, uint8_t *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (uint8_t)((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
        *mn = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

static void qgk_pack(bool five, const ember_matrix *w, void *dst) {
    const int64_t nb = w->n_in / EMBER_QK_K;
    const size_t sbb = qgk_sb_bytes(five), osc = qgk_off_sc(five),
                 fbytes = five ? sizeof(ember_block_q5_K) : sizeof(ember_block_q4_K);
    const size_t fqs = five ? 48 : 16; /* qs in the file's block (Q5_K: after qh[32] at 16) */
    uint8_t *d = dst;
    for (int64_t row0 = 0; row0 < w->n_out; row0 += 4)
        for (int64_t b = 0; b < nb; b++, d += sbb) {
            memset(d, 0, sbb); /* missing rows: scales, minimums and d of 0 */
            for (int r = 0; r < 4 && row0 + r < w->n_out; r++) {
                const uint8_t *blk = (const uint8_t *)w->data + (size_t)(row0 + r) * w->row_bytes + (size_t)b * fbytes;
                for (int k = 0; k < 8; k++)
                    for (int c = 0; c < 4; c++) memcpy(d + 64 * k + (r * 4 + c) * 4, blk + fqs + 32 * c + 4 * k, 4);
                if (five)
                    for (int k = 0; k < 8; k++)
                        for (int c = 0; c < 4; c++)
                            for (int i = 0; i < 4; i++) {
                                const uint8_t qh = blk[16 + 4 * k + i];
                                const int l = k / 2;
                                d[512 + 64 * (k % 2) + (r * 4 + c) * 4 + i] |=
                                    (uint8_t)(((qh >> (2 * c)) & 1) << (2 * l) | ((qh >> (2 * c + 1)) & 1)
                                                                                     << (2 * l + 1));
                            }
                for (int j = 0; j < 8; j++) qg_k4_scale_min(blk + 4, j, d + osc + r * 8 + j, d + osc + 32 + r * 8 + j);
                memcpy(d + osc + 64 + 2 * r, blk, 2);
                memcpy(d + osc + 72 + 2 * r, blk + 2, 2);
            }
        }
}
static size_t qg4k_pack_size(const ember_matrix *w) { return qgk_pack_size(false, w); }
static void qg4k_pack(const ember_matrix *w, void *dst) { qgk_pack(false, w, dst); }
static size_t qg5k_pack_size(const ember_matrix *w) { return qgk_pack_size(true, w); }
static void qg5k_pack(const ember_matrix *w, void *dst) { qgk_pack(true, w, dst); }

/* Step k of a Q4_K/Q5_K super-block: the quants of the low nibbles (sub-blocks 2c) and of the high
 * ones (2c + 1) of both halves, Q5_K's fifth bits or-ed in. */
EMBER_AI void qgk_unpack(bool five, const uint8_t *g, int k, __m256i lo[2], __m256i hi[2]) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), bit4 = _mm256_set1_epi8(0x10);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(g + 64 * k + 32 * h));
        lo[h] = _mm256_and_si256(v, low4);
        hi[h] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
        if (five) {
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(g + 512 + 64 * (k % 2) + 32 * h));
            lo[h] = _mm256_or_si256(lo[h], _mm256_and_si256(qg_shift16(qh, 4 - 2 * (k / 2)), bit4));
            hi[h] = _mm256_or_si256(hi[h], _mm256_and_si256(qg_shift16(qh, 3 - 2 * (k / 2)), bit4));
        }
    }
}

/* The integer part of one super-block for T tokens: a[t][h] = per (row, sub-block pair) lane of
 * half h, sc_2c * (sum of sub-block 2c's q y) + sc_2c+1 * (sum of 2c+1's), exact. `ya` is the
 * super-block's offset in the prepared activations. */
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
/* VNNI: unscaled sums per sub-block (low / high nibbles apart), scaled once at the end. */
EMBER_AI void qgk_ints(bool five, const uint8_t *g, const uint8_t *const *xs, int T, size_t ya,
                       __m256i a[QG_MAX_T][2]) {
    const __m256i lo16 = _mm256_set1_epi32(0xFFFF);
    const size_t osc = qgk_off_sc(five);
    /* int32 lane l of half h: sc of (row, sub-block 2c) in the low 16 bits, of 2c + 1 in the high */
    __m256i sclo[2], schi[2];
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m256i s = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(g + osc + 16 * h)));
        sclo[h] = _mm256_and_si256(s, lo16);
        schi[h] = _mm256_srli_epi32(s, 16);
    }
    __m256i alo[QG_MAX_T][2], ahi[QG_MAX_T][2];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) alo[t][0] = alo[t][1] = ahi[t][0] = ahi[t][1] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        __m256i lo[2], hi[2];
        qgk_unpack(five, g, k, lo, hi);
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            const __m256i ylo = qg_bcast16(xs[t] + ya + 32 * k), yhi = qg_bcast16(xs[t] + ya + 32 * k + 16);
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                alo[t][h] = _mm256_dpbusd_epi32(alo[t][h], lo[h], ylo);
                ahi[t][h] = _mm256_dpbusd_epi32(ahi[t][h], hi[h], yhi);
            }
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++)
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++)
            a[t][h] = _mm256_add_epi32(_mm256_mullo_epi32(alo[t][h], sclo[h]), _mm256_mullo_epi32(ahi[t][h], schi[h]));
}
#else
/* AVX2: vpmaddubsw's 16-bit pair sums (<= 2 * 15 * 127 = 3810 for Q4_K, 2 * 31 * 127 = 7874 for
 * Q5_K) are multiplied by the lane's scale with vpmaddwd into int32. Up to 2 tokens, they are first
 * added in 16 bits over a run of steps and multiplied once per run: all 8 steps for Q4_K (<= 30480)
 * and runs of 4 for Q5_K (<= 31496), so the 16-bit sums never wrap and a vpmaddwd and an add per
 * step and nibble are saved. With 3-4 tokens the 16-bit sums would not fit in the registers, so each
 * step is multiplied at once. */
EMBER_AI void qgk_ints(bool five, const uint8_t *g, const uint8_t *const *xs, int T, size_t ya,
                       __m256i a[QG_MAX_T][2]) {
    const size_t osc = qgk_off_sc(five);
    const int run = T <= 2 ? (five ? 4 : 8) : 1;
    /* int16 pairs of lane (r, c): sc of sub-block 2c twice (s16lo), of 2c + 1 twice (s16hi); the 16
     * scale bytes of half h are rows 2h (bytes 0-7) and 2h + 1 (8-15), one per 128-bit half */
    const __m256i ctl_lo = _mm256_setr_epi8(0, -1, 0, -1, 2, -1, 2, -1, 4, -1, 4, -1, 6, -1, 6, -1, 8, -1, 8, -1, 10,
                                            -1, 10, -1, 12, -1, 12, -1, 14, -1, 14, -1);
    const __m256i ctl_hi = _mm256_or_si256(ctl_lo, _mm256_set1_epi16(1));
    __m256i s16lo[2], s16hi[2], slo[QG_MAX_T][2], shi[QG_MAX_T][2];
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m256i sc = qg_bcast16(g + osc + 16 * h);
        s16lo[h] = _mm256_shuffle_epi8(sc, ctl_lo);
        s16hi[h] = _mm256_shuffle_epi8(sc, ctl_hi);
    }
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        __m256i lo[2], hi[2];
        qgk_unpack(five, g, k, lo, hi);
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            const __m256i ylo = qg_bcast16(xs[t] + ya + 32 * k), yhi = qg_bcast16(xs[t] + ya + 32 * k + 16);
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                const __m256i plo = _mm256_maddubs_epi16(lo[h], ylo), phi = _mm256_maddubs_epi16(hi[h], yhi);
                slo[t][h] = k % run == 0 ? plo : _mm256_add_epi16(slo[t][h], plo);
                shi[t][h] = k % run == 0 ? phi : _mm256_add_epi16(shi[t][h], phi);
                ember_pin256(&slo[t][h]), ember_pin256(&shi[t][h]);
                if (k % run == run - 1) {
                    const __m256i r = _mm256_add_epi32(_mm256_madd_epi16(slo[t][h], s16lo[h]),
                                                       _mm256_madd_epi16(shi[t][h], s16hi[h]));
                    a[t][h] = k == run - 1 ? r : _mm256_add_epi32(a[t][h], r);
                    ember_pin256(&a[t][h]);
                }
            }
        }
    }
}
#endif

EMBER_AI void qgk_group(bool five, const uint8_t *g, const uint8_t *const *xs, int T, int64_t nb, float *y,
                        int64_t n_out, int rows) {
    const size_t osc = qgk_off_sc(five), sbb = qgk_sb_bytes(five);
    __m128 p[QG_MAX_T], m[QG_MAX_T];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) p[t] = m[t] = _mm_setzero_ps();
    for (int64_t b = 0; b < nb; b++, g += sbb) {
        const size_t ya = (size_t)b * QG4K_ACT_BYTES;
        __m256i a[QG_MAX_T][2];
        qgk_ints(five, g, xs, T, ya, a);
        __m256i mn[2];
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++)
            mn[h] = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(g + osc + 32 + 16 * h)));
        const __m128 dw = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(g + osc + 64)));
        const __m128 dmw = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(g + osc + 72)));
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            __m256i bm[2];
            const __m256i bs = qg_bcast16(xs[t] + ya + 256);
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) bm[h] = _mm256_madd_epi16(mn[h], bs); /* lane (r, j pair): mn x bsum32, exact */
            const __m128i A = qg_rowsum(a[t][0], a[t][1]), B = qg_rowsum(bm[0], bm[1]);
            float dxs;
            memcpy(&dxs, xs[t] + ya + 272, 4);
            const __m128 dx = _mm_set1_ps(dxs);
            p[t] = _mm_fmadd_ps(_mm_cvtepi32_ps(A), _mm_mul_ps(dw, dx), p[t]);
            m[t] = _mm_fmadd_ps(_mm_cvtepi32_ps(B), _mm_mul_ps(dmw, dx), m[t]);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) qg_store(y + t * n_out, _mm_sub_ps(p[t], m[t]), rows);
}

/* ======================== Q6_K x Q8_K ========================
 * A row's value v (0..255) is reached as step k = 0..15, lane c = 0..3, byte i = 0..3 with
 *     v = 64 (k / 4) + 16 c + 4 (k % 4) + i
 * so lane c over the 4 steps of quarter g = k / 4 covers exactly sub-block 4g + c (16 values, one
 * scale). Group layout: per super-block b, 840 bytes (the file's 4 x 210, reordered):
 *     [0, 512)    m = 0..7: 64 bytes, entry (r*4 + c)*4 + i: low nibble = low 4 bits of row r's
 *                 value at step m, high nibble = of its value at step m + 8
 *     [512, 768)  n = 0..3: 64 bytes, entry (r*4 + c)*4 + i: bits 2l, 2l+1 = the high 2 bits of
 *                 the value at step n + 4l (l = 0..3)
 *     [768, 832)  quarter g: 16 bytes, entry r*4 + c = int8 scale of sub-block 4g + c of row r
 *     [832, 840)  d of rows 0-3 (f16)
 * The unsigned quants (0..63) are multiplied; each lane starts from -32 * bsum16 of its sub-block,
 * so after a quarter it holds the exact sum of (q - 32) * y, which is then scaled: A_b exactly.
 *
 * Prepared activations of one token: per super-block 336 bytes
 *     [0, 256)    step k: 16 bytes, entry c*4 + i = y[64 (k / 4) + 16 c + 4 (k % 4) + i]
 *     [256, 320)  quarter g: 4 int32, entry c = -32 * bsums[4g + c]
 *     [320, 324)  d (f32); [324, 336) zero
 * followed by the Q8_K blocks themselves (for the row kernels). */
#define QG6K_SB_BYTES 840
#define QG6K_ACT_BYTES 336

static size_t qg6k_act_size(int64_t n_in) {
    return (size_t)(n_in / EMBER_QK_K) * (QG6K_ACT_BYTES + sizeof(ember_block_q8_K));
}
EMBER_AI size_t qg6k_off_q8k(int64_t nb) { return (size_t)nb * QG6K_ACT_BYTES; }

EMBER_AI int qg6k_value(int k, int c, int i) { return 64 * (k / 4) + 16 * c + 4 * (k % 4) + i; }

static void qg6k_act_prepare(const float *x, void *xa, int64_t n_in) {
    const int64_t nb = n_in / EMBER_QK_K;
    uint8_t *o = xa;
    ember_block_q8_K *q = (ember_block_q8_K *)(o + qg6k_off_q8k(nb));
    for (int64_t b = 0; b < nb; b++, o += QG6K_ACT_BYTES) {
        const ember_block_q8_K *y = &q[b];
        qg_q8k_block(x + b * EMBER_QK_K, &q[b]);
        for (int g = 0; g < 4; g++) { /* quarter g: step 4g + kk = 4-byte group kk of y[64g + 16c ..] */
            const uint8_t *r = (const uint8_t *)y->qs + 64 * g;
            qg_transpose4x4(r, r + 16, r + 32, r + 48, o + 64 * g, 16);
        }
        int32_t corr[16];
        for (int s = 0; s < 16; s++) corr[s] = -32 * y->bsums[s];
        memcpy(o + 256, corr, 64);
        memcpy(o + 320, &y->d, 4);
        memset(o + 324, 0, 12);
    }
}

static size_t qg6k_pack_size(const ember_matrix *w) {
    return (size_t)((w->n_out + 3) / 4) * (size_t)(w->n_in / EMBER_QK_K) * QG6K_SB_BYTES;
}

/* The 6-bit quant of value v of a Q6_K super-block (ggml's layout, quants_dequant.c). */
static int qg6k_quant(const uint8_t *blk, int v) {
    const int n = v / 128, k = (v % 128) / 32, l = v % 32;
    const uint8_t lo = blk[64 * n + (k % 2) * 32 + l];
    const int nib = k < 2 ? lo & 0xF : lo >> 4;
    return nib | ((blk[128 + 32 * n + l] >> (2 * k)) & 3) << 4;
}

static void qg6k_pack(const ember_matrix *w, void *dst) {
    const int64_t nb = w->n_in / EMBER_QK_K;
    uint8_t *d = dst;
    for (int64_t row0 = 0; row0 < w->n_out; row0 += 4)
        for (int64_t b = 0; b < nb; b++, d += QG6K_SB_BYTES) {
            memset(d, 0, QG6K_SB_BYTES); /* missing rows: quants 0 with scale 0 and d 0 */
            for (int r = 0; r < 4 && row0 + r < w->n_out; r++) {
                const uint8_t *blk =
                    (const uint8_t *)w->data + (size_t)(row0 + r) * w->row_bytes + (size_t)b * sizeof(ember_block_q6_K);
                for (int c = 0; c < 4; c++)
                    for (int i = 0; i < 4; i++) {
                        const int e = (r * 4 + c) * 4 + i;
                        for (int mm = 0; mm < 8; mm++)
                            d[64 * mm + e] = (uint8_t)((qg6k_quant(blk, qg6k_value(mm, c, i)) & 15) |
                                                       (qg6k_quant(blk, qg6k_value(mm + 8, c, i)) & 15) << 4);
                        for (int n = 0; n < 4; n++) {
                            uint8_t h = 0;
                            for (int l = 0; l < 4; l++)
                                h |= (uint8_t)((qg6k_quant(blk, qg6k_value(n + 4 * l, c, i)) >> 4) << (2 * l));
                            d[512 + 64 * n + e] = h;
                        }
                    }
                for (int qq = 0; qq < 4; qq++)
                    for (int c = 0; c < 4; c++) d[768 + 16 * qq + r * 4 + c] = blk[192 + 4 * qq + c];
                memcpy(d + 832 + 2 * r, blk + 208, 2);
            }
        }
}

EMBER_AI void qg6k_group(const uint8_t *g, const uint8_t *const *xs, int T, int64_t nb, float *y, int64_t n_out,
                         int rows) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    __m128 p[QG_MAX_T];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) p[t] = _mm_setzero_ps();
    for (int64_t b = 0; b < nb; b++, g += QG6K_SB_BYTES) {
        const size_t ya = (size_t)b * QG6K_ACT_BYTES;
        __m256i A[QG_MAX_T][2];
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) A[t][0] = A[t][1] = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int qq = 0; qq < 4; qq++) {
            __m256i acc[QG_MAX_T][2];
#if !(defined(__AVX512VNNI__) && defined(__AVX512VL__))
            __m256i s16[QG_MAX_T][2];
#endif
#pragma GCC unroll 4
            for (int t = 0; t < T; t++) acc[t][0] = acc[t][1] = qg_bcast16(xs[t] + ya + 256 + 16 * qq);
#pragma GCC unroll 4
            for (int kk = 0; kk < 4; kk++) {
                const int k = 4 * qq + kk;
                __m256i q[2];
#pragma GCC unroll 2
                for (int h = 0; h < 2; h++) {
                    const __m256i l = _mm256_loadu_si256((const __m256i *)(g + 64 * (k % 8) + 32 * h));
                    const __m256i hb = _mm256_loadu_si256((const __m256i *)(g + 512 + 64 * kk + 32 * h));
                    const __m256i lo =
                        qq < 2 ? _mm256_and_si256(l, low4) : _mm256_and_si256(_mm256_srli_epi16(l, 4), low4);
                    const __m256i hi = qq == 0   ? _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30)
                                       : qq == 1 ? _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30)
                                       : qq == 2 ? _mm256_and_si256(hb, m30)
                                                 : _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30);
                    q[h] = _mm256_or_si256(lo, hi);
                }
#pragma GCC unroll 4
                for (int t = 0; t < T; t++) {
                    const __m256i yv = qg_bcast16(xs[t] + ya + 16 * k);
#pragma GCC unroll 2
                    for (int h = 0; h < 2; h++) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
                        acc[t][h] = qg_dot(acc[t][h], q[h], yv);
#else
                        /* pair sums <= 2 * 63 * 127 = 16002: two steps added in 16 bits (<= 32004) */
                        const __m256i pr = _mm256_maddubs_epi16(q[h], yv);
                        s16[t][h] = kk % 2 == 0 ? pr : _mm256_add_epi16(s16[t][h], pr);
                        ember_pin256(&s16[t][h]);
                        if (kk % 2 == 1) {
                            acc[t][h] = _mm256_add_epi32(acc[t][h], _mm256_madd_epi16(s16[t][h], _mm256_set1_epi16(1)));
                            ember_pin256(&acc[t][h]);
                        }
#endif
                    }
                }
            }
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                const __m256i sc = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(g + 768 + 16 * qq + 8 * h)));
#pragma GCC unroll 4
                for (int t = 0; t < T; t++) {
                    A[t][h] = _mm256_add_epi32(A[t][h], _mm256_mullo_epi32(acc[t][h], sc));
#if !(defined(__AVX512VNNI__) && defined(__AVX512VL__))
                    ember_pin256(&A[t][h]);
#endif
                }
            }
        }
        const __m128 dw = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(g + 832)));
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            float dxs;
            memcpy(&dxs, xs[t] + ya + 320, 4);
            p[t] = _mm_fmadd_ps(_mm_cvtepi32_ps(qg_rowsum(A[t][0], A[t][1])), _mm_mul_ps(dw, _mm_set1_ps(dxs)), p[t]);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) qg_store(y + t * n_out, p[t], rows);
}

/* Instances with T fixed (1..4), so each is compiled for its tile. */
#define QG_INSTANCES(name, fn)                                                                                         \
    static void name##_1(const uint8_t *g, const uint8_t *const *xs, int64_t nb, float *y, int64_t n, int rows) {      \
        fn(g, xs, 1, nb, y, n, rows);                                                                                  \
    }                                                                                                                  \
    static void name##_2(const uint8_t *g, const uint8_t *const *xs, int64_t nb, float *y, int64_t n, int rows) {      \
        fn(g, xs, 2, nb, y, n, rows);                                                                                  \
    }                                                                                                                  \
    static void name##_3(const uint8_t *g, const uint8_t *const *xs, int64_t nb, float *y, int64_t n, int rows) {      \
        fn(g, xs, 3, nb, y, n, rows);                                                                                  \
    }                                                                                                                  \
    static void name##_4(const uint8_t *g, const uint8_t *const *xs, int64_t nb, float *y, int64_t n, int rows) {      \
        fn(g, xs, 4, nb, y, n, rows);                                                                                  \
    }                                                                                                                  \
    static const qg_kernel_fn name[QG_MAX_T] = {name##_1, name##_2, name##_3, name##_4};
#define QG32_GROUP(kind)                                                                                               \
    EMBER_AI void qg32_group_##kind(const uint8_t *g, const uint8_t *const *xs, int T, int64_t nb, float *y,           \
                                    int64_t n_out, int rows) {                                                         \
        qg32_group(kind, g, xs, T, nb, y, n_out, rows);                                                                \
    }
QG32_GROUP(QG_Q4_0)
QG32_GROUP(QG_Q4_1)
QG32_GROUP(QG_Q5_0)
QG32_GROUP(QG_Q5_1)
QG_INSTANCES(qg40_kern, qg32_group_QG_Q4_0)
QG_INSTANCES(qg41_kern, qg32_group_QG_Q4_1)
QG_INSTANCES(qg50_kern, qg32_group_QG_Q5_0)
QG_INSTANCES(qg51_kern, qg32_group_QG_Q5_1)
EMBER_AI void qg4k_group(const uint8_t *g, const uint8_t *const *xs, int T, int64_t nb, float *y, int64_t n, int rows) {
    qgk_group(false, g, xs, T, nb, y, n, rows);
}
EMBER_AI void qg5k_group(const uint8_t *g, const uint8_t *const *xs, int T, int64_t nb, float *y, int64_t n, int rows) {
    qgk_group(true, g, xs, T, nb, y, n, rows);
}
QG_INSTANCES(qg4k_kern, qg4k_group)
QG_INSTANCES(qg5k_kern, qg5k_group)
QG_INSTANCES(qg6k_kern, qg6k_group)

#endif
