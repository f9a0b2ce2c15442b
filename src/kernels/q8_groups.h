/* q8_groups.h — the Q8_0 product that avx2.c and avx512.c share: one weight layout (4-row groups,
 * built at load or on the fly), one prepared-activation layout, one order of operations. Included
 * by both files and compiled with each file's flags; only the span kernels differ per set.
 *
 * The order of operations (docs/kernels.md): the output for weight row r and token t keeps four
 * partial sums p0..p3 starting at +0. Block b (in increasing b) adds into p[b % 4]:
 *     p = fma(f32(isum_b), f32(d_w,b) * d_x,b, p)
 * where isum_b = sum of the block's 32 products w_i q_i (exact in int32) and d_x,b is the
 * activation block's f16 scale as f32. The result is (p0 + p1) + (p2 + p3). Blocks past the end of
 * a row are padding with exact zeros (fma(+0, +0, p) = p: p is never -0).
 *
 * Why this order: each SIMD lane holds one (row, block) pair for a whole block, so the integer dot
 * products accumulate over 8 steps of 4 bytes without a conversion in between; one conversion and
 * one fused multiply-add per block instead of per 4 products: about a third of the instructions
 * per byte of weights (prefill, which is compute-bound, went 1.5-1.7x faster).
 *
 * Weight layout: rows are taken 4 at a time (rows past n_out are zeros); a group is a sequence of
 * spans of 8 blocks (the row's blocks padded to a multiple of 8). One span is 1088 bytes:
 *     [0, 64)       32 f16 scales: entry h*16 + r*4 + j = d_w of row r, block 8s + 4h + j
 *     [64, 1088)    for h in 0..1, k in 0..7: 64 bytes, entry (r*4 + j)*4 + i =
 *                   u8(w + 128) of row r, block 8s + 4h + j, quant 4k + i
 * i.e. a 64-byte vector holds 4 bytes of each of the 16 (row, block) pairs of a quad of blocks.
 * The bytes are the file's 34 per block (plus padding), reordered; a span is 17 cache lines.
 *
 * Prepared activations of one token (nb8 = blocks rounded up to 8):
 *     [0, 32 nb8)          quants, interleaved like the weights: quad Q, step k: 16 bytes,
 *                          entry j*4 + i = q of block 4Q + j, quant 4k + i (int8)
 *     [32 nb8, 36 nb8)     d_x per block as f32 (padding 0)
 *     [36 nb8, 40 nb8)     per block -128 * (sum of its 32 quants) as int32 (padding 0): the
 *                          start value that makes a u8(w + 128) x s8 dot product exact
 *     [40 nb8, 72 nb8)     the quants again in block order (for reading file-layout rows) */
#ifndef EMBER_Q8_GROUPS_H
#define EMBER_Q8_GROUPS_H

#include "simd_common.h"

#define Q8G_SPAN_BLOCKS 8
#define Q8G_SPAN_BYTES 1088
/* Spans repacked at a time on the stack when the weights are read from the file layout. */
#define Q8G_CHUNK_SPANS 32
#define Q8G_MAX_TOKENS EMBER_MATMUL_MAX_TOKENS

EMBER_AI int64_t q8g_spans(int64_t nb) { return (nb + Q8G_SPAN_BLOCKS - 1) / Q8G_SPAN_BLOCKS; }
EMBER_AI size_t q8g_group_bytes(int64_t nb) { return (size_t)q8g_spans(nb) * Q8G_SPAN_BYTES; }

EMBER_AI size_t q8g_off_dx(int64_t nb) { return (size_t)q8g_spans(nb) * Q8G_SPAN_BLOCKS * 32; }
EMBER_AI size_t q8g_off_corr(int64_t nb) { return (size_t)q8g_spans(nb) * Q8G_SPAN_BLOCKS * 36; }
EMBER_AI size_t q8g_off_plain(int64_t nb) { return (size_t)q8g_spans(nb) * Q8G_SPAN_BLOCKS * 40; }
EMBER_AI size_t q8g_act_size(int64_t n_in) { return (size_t)q8g_spans(n_in / EMBER_QK8_0) * Q8G_SPAN_BLOCKS * 72; }

/* Stores block b of a token's prepared activations: its 32 quants and its scale. */
EMBER_AI void q8g_act_block(uint8_t *xa, int64_t nb, int64_t b, const int8_t q[32], float dx) {
    uint8_t *quad = xa + (b / 4) * 128 + (b % 4) * 4;
    int32_t sum = 0;
    for (int k = 0; k < 8; k++) memcpy(quad + 16 * k, q + 4 * k, 4);
    for (int i = 0; i < 32; i++) sum += q[i];
    const int32_t corr = -128 * sum;
    memcpy(xa + q8g_off_dx(nb) + 4 * b, &dx, 4);
    memcpy(xa + q8g_off_corr(nb) + 4 * b, &corr, 4);
    memcpy(xa + q8g_off_plain(nb) + 32 * b, q, 32);
}

/* Zeros blocks nb .. nb8-1 (after the real blocks are stored). */
EMBER_AI void q8g_act_pad(uint8_t *xa, int64_t nb) {
    static const int8_t zero[32];
    for (int64_t b = nb; b < q8g_spans(nb) * Q8G_SPAN_BLOCKS; b++) q8g_act_block(xa, nb, b, zero, 0.0f);
}

/* Spans [s0, s1) of the 4-row group starting at row0 of a file-layout Q8_0 matrix, into dst. */
static void q8g_pack_spans(const ember_matrix *w, int64_t row0, int64_t s0, int64_t s1, uint8_t *dst) {
    const int64_t nb = w->n_in / EMBER_QK8_0;
    for (int64_t s = s0; s < s1; s++, dst += Q8G_SPAN_BYTES) {
        uint16_t *scales = (uint16_t *)dst;
        memset(dst, 0, 64);                          /* scale 0 for missing rows and blocks */
        memset(dst + 64, 0x80, Q8G_SPAN_BYTES - 64); /* u8 128 = weight 0 */
        for (int r = 0; r < 4 && row0 + r < w->n_out; r++) {
            const uint8_t *row = (const uint8_t *)w->data + (size_t)(row0 + r) * w->row_bytes;
            for (int h = 0; h < 2; h++)
                for (int j = 0; j < 4; j++) {
                    const int64_t b = s * Q8G_SPAN_BLOCKS + 4 * h + j;
                    if (b >= nb) continue;
                    const uint8_t *blk = row + b * sizeof(ember_block_q8_0);
                    scales[h * 16 + r * 4 + j] = ember_load_u16(blk);
                    uint8_t *q = dst + 64 + h * 512 + (r * 4 + j) * 4;
                    for (int k = 0; k < 8; k++) {
                        uint32_t v;
                        memcpy(&v, blk + 2 + 4 * k, 4);
                        v ^= 0x80808080u;
                        memcpy(q + 64 * k, &v, 4);
                    }
                }
        }
    }
}

static size_t q8g_pack_size(const ember_matrix *w) {
    return (size_t)((w->n_out + 3) / 4) * q8g_group_bytes(w->n_in / EMBER_QK8_0);
}

/* The whole matrix (the kernel table's `pack`). */
static void q8g_pack(const ember_matrix *w, void *dst) {
    const int64_t nb = w->n_in / EMBER_QK8_0, ns = q8g_spans(nb);
    for (int64_t row0 = 0; row0 < w->n_out; row0 += 4)
        q8g_pack_spans(w, row0, 0, ns, (uint8_t *)dst + (size_t)(row0 / 4) * q8g_group_bytes(nb));
}

/* For the row kernels (one file-layout row, one token): d_w of blocks b..b+3 as f32 (0 past nb),
 * and the end of the order from the 4 partial sums. */
EMBER_AI __m128 q8g_row_scales4(const uint8_t *row, int64_t b, int64_t nb) {
    uint16_t d[4] = {0, 0, 0, 0};
    for (int j = 0; j < 4 && b + j < nb; j++) d[j] = ember_load_u16(row + (b + j) * sizeof(ember_block_q8_0));
    return _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)d));
}

EMBER_AI float q8g_row_finish(__m128 p) {
    float l[4];
    _mm_storeu_ps(l, p);
    return (l[0] + l[1]) + (l[2] + l[3]);
}

/* One span kernel call: spans [s0, s1) of a group (g points at span s0) times T tokens. The 16
 * partial sums of token t (lane r*4 + j = p_j of row r) start at +0 when `first`, else from
 * lanes[t*16 ..]. With y set the call is the last one: it writes row r < rows of token t to
 * y[t * n_out + r] ((p0 + p1) + (p2 + p3), the end of the order); otherwise it stores the partial
 * sums back to lanes. */
typedef void (*q8g_kernel_fn)(const uint8_t *g, const uint8_t *const *xs, int64_t nb, int64_t s0, int64_t s1,
                              float *lanes, bool first, float *y, int64_t n_out, int rows);

/* Rows [o0, o1) of y = x W^T for n_tok <= Q8G_MAX_TOKENS tokens (o0 a multiple of 4). kern[T-1]
 * takes T tokens, T <= t_max. Repacked weights are read in place in one call per token tile;
 * file-layout ones are repacked Q8G_CHUNK_SPANS spans at a time into a stack buffer, so both run
 * the same kernels. */
/* One file-layout weight row times one prepared token, in the same order of operations (a set's
 * faster path for decoding with unrepacked weights; NULL: repack on the fly instead). */
typedef float (*q8g_row_fn)(const uint8_t *row, const uint8_t *xa, int64_t nb);

static void q8g_rows(const q8g_kernel_fn *kern, int t_max, q8g_row_fn row_kernel, const ember_matrix *w, const void *xa,
                     size_t xa_stride, float *y, int64_t n_tok, int64_t o0, int64_t o1) {
    if (n_tok > Q8G_MAX_TOKENS) { /* callers slice longer runs; stay in bounds if one does not */
        for (int64_t t0 = 0; t0 < n_tok; t0 += Q8G_MAX_TOKENS)
            q8g_rows(kern, t_max, row_kernel, w, (const uint8_t *)xa + (size_t)t0 * xa_stride, xa_stride,
                     y + t0 * w->n_out, n_tok - t0 < Q8G_MAX_TOKENS ? n_tok - t0 : Q8G_MAX_TOKENS, o0, o1);
        return;
    }
    const int64_t nb = w->n_in / EMBER_QK8_0, ns = q8g_spans(nb);
    if (!w->packed && n_tok == 1 && row_kernel) { /* rows one at a time: one sequential stream */
        for (int64_t o = o0; o < o1; o++)
            y[o] = row_kernel((const uint8_t *)w->data + (size_t)o * w->row_bytes, xa, nb);
        return;
    }
    const size_t gbytes = q8g_group_bytes(nb);
    const uint8_t *xs[Q8G_MAX_TOKENS];
    for (int64_t t = 0; t < n_tok; t++) xs[t] = (const uint8_t *)xa + (size_t)t * xa_stride;
    for (int64_t o = o0; o < o1; o += 4) {
        const int rows = o1 - o < 4 ? (int)(o1 - o) : 4;
        if (w->packed) {
            const uint8_t *g = (const uint8_t *)w->packed + (size_t)(o / 4) * gbytes;
            for (int64_t t = 0; t < n_tok; t += t_max) {
                const int T = n_tok - t < t_max ? (int)(n_tok - t) : t_max;
                kern[T - 1](g, xs + t, nb, 0, ns, NULL, true, y + t * w->n_out + o, w->n_out, rows);
            }
            continue;
        }
        _Alignas(64) uint8_t buf[Q8G_CHUNK_SPANS * Q8G_SPAN_BYTES];
        _Alignas(64) float lanes[Q8G_MAX_TOKENS * 16];
        for (int64_t s0 = 0, s1; s0 < ns; s0 = s1) {
            s1 = ns - s0 < Q8G_CHUNK_SPANS ? ns : s0 + Q8G_CHUNK_SPANS;
            q8g_pack_spans(w, o, s0, s1, buf);
            for (int64_t t = 0; t < n_tok; t += t_max) {
                const int T = n_tok - t < t_max ? (int)(n_tok - t) : t_max;
                kern[T - 1](buf, xs + t, nb, s0, s1, lanes + t * 16, s0 == 0, s1 == ns ? y + t * w->n_out + o : NULL,
                            w->n_out, rows);
            }
        }
    }
}

#endif
