/* transposed_simd.h — the transposed product dx = g W (the backward pass's) that avx2.c and avx512.c
 * share: a panel of weights dequantized exactly, register tiles of 4 tokens x 16 columns, and the
 * order kernels.h gives (EMBER_MATMUL_T_CHUNK rows per partial, each step a product then an add).
 * Include only from files compiled with -ffp-contract=off: nothing here may fuse a multiply-add.
 *
 * Why one code for both sets: every element is its own sequential sum, so the vector width changes
 * nothing of what is computed; AVX-512 would only widen the tile. Sharing the AVX2 code keeps the
 * avx512 set identical to avx2 (and both to the reference) by construction. Q8_0 is not here: its
 * table entry is transposed_q8.h's integer product (the fast order), included by each set. */
#ifndef EMBER_TRANSPOSED_SIMD_H
#define EMBER_TRANSPOSED_SIMD_H

#include "simd_common.h"

/* Columns of a panel: ember_matmul_t_panel's widths are 64 or 256. */
#define TS_PANEL_MAX 256

/* Rows o0 .. o0+nr-1, columns c0 .. c0+cw-1 of w as f32 (exact), row r at panel + r * cw. */
typedef void (*ts_dequant_fn)(const ember_matrix *w, int64_t o0, int64_t nr, int64_t c0, int64_t cw, float *panel);

static void ts_deq_generic(const ember_matrix *w, int64_t o0, int64_t nr, int64_t c0, int64_t cw, float *panel) {
    const ember_type_traits *tr = ember_type_traits_get(w->type);
    const size_t off = (size_t)(c0 / tr->block_size) * tr->block_bytes;
    for (int64_t r = 0; r < nr; r++)
        tr->to_float((const uint8_t *)w->data + (size_t)(o0 + r) * w->row_bytes + off, panel + r * cw, cw);
}

static void ts_deq_f16(const ember_matrix *w, int64_t o0, int64_t nr, int64_t c0, int64_t cw, float *panel) {
    const int64_t c8 = cw & ~(int64_t)7;
    for (int64_t r = 0; r < nr; r++) {
        const uint16_t *row = (const uint16_t *)((const uint8_t *)w->data + (size_t)(o0 + r) * w->row_bytes) + c0;
        float *out = panel + r * cw;
        for (int64_t i = 0; i < c8; i += 8)
            _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + i))));
        for (int64_t i = c8; i < cw; i++) {
            uint16_t h;
            memcpy(&h, row + i, 2);
            out[i] = ember_f16_to_f32(h);
        }
    }
}

static void ts_deq_bf16(const ember_matrix *w, int64_t o0, int64_t nr, int64_t c0, int64_t cw, float *panel) {
    const int64_t c8 = cw & ~(int64_t)7;
    for (int64_t r = 0; r < nr; r++) {
        const uint16_t *row = (const uint16_t *)((const uint8_t *)w->data + (size_t)(o0 + r) * w->row_bytes) + c0;
        float *out = panel + r * cw;
        for (int64_t i = 0; i < c8; i += 8) { /* bf16 is the high half of an f32 */
            const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(row + i)));
            _mm256_storeu_ps(out + i, _mm256_castsi256_ps(_mm256_slli_epi32(h, 16)));
        }
        for (int64_t i = c8; i < cw; i++) {
            uint16_t h;
            memcpy(&h, row + i, 2);
            out[i] = ember_bf16_to_f32(h);
        }
    }
}

/* One tile of T tokens (1 or 4) by V vectors of 8 columns (1 or 2) over nr panel rows: each lane's
 * partial from +0, then stored (first chunk) or added to what dx holds. */
EMBER_AI void ts_tile(const float *p, int64_t ps, const float *g, int64_t gs, float *dx, int64_t ds, int64_t nr,
                      const int T, const int V, bool first) {
    __m256 acc[4][2];
    for (int k = 0; k < T; k++)
        for (int v = 0; v < V; v++) acc[k][v] = _mm256_setzero_ps();
    for (int64_t r = 0; r < nr; r++) {
        __m256 wv[2];
        for (int v = 0; v < V; v++) wv[v] = _mm256_loadu_ps(p + r * ps + 8 * v);
        for (int k = 0; k < T; k++) {
            const __m256 gk = _mm256_broadcast_ss(g + k * gs + r);
            for (int v = 0; v < V; v++) acc[k][v] = _mm256_add_ps(acc[k][v], _mm256_mul_ps(gk, wv[v]));
        }
    }
    for (int k = 0; k < T; k++)
        for (int v = 0; v < V; v++) {
            float *d = dx + k * ds + 8 * v;
            _mm256_storeu_ps(d, first ? acc[k][v] : _mm256_add_ps(_mm256_loadu_ps(d), acc[k][v]));
        }
}

/* The same for one column (the tail past the last whole vector), T tokens. */
EMBER_AI void ts_column(const float *p, int64_t ps, const float *g, int64_t gs, float *dx, int64_t ds, int64_t nr,
                        const int T, bool first) {
    for (int k = 0; k < T; k++) {
        float s = 0.0f;
        for (int64_t r = 0; r < nr; r++) s = s + g[k * gs + r] * p[r * ps];
        dx[k * ds] = first ? s : dx[k * ds] + s;
    }
}

/* Every tile of one chunk: nt tokens, cw columns of the panel p (row stride ps). */
EMBER_AI void ts_chunk_tokens(const float *p, int64_t ps, const float *g, int64_t gs, float *dx, int64_t ds, int64_t nr,
                              int64_t cw, const int T, bool first) {
    int64_t c = 0;
    for (; c + 16 <= cw; c += 16) ts_tile(p + c, ps, g, gs, dx + c, ds, nr, T, 2, first);
    for (; c + 8 <= cw; c += 8) ts_tile(p + c, ps, g, gs, dx + c, ds, nr, T, 1, first);
    for (; c < cw; c++) ts_column(p + c, ps, g, gs, dx + c, ds, nr, T, first);
}

static void ts_chunk(const float *p, int64_t ps, const float *g, int64_t gs, float *dx, int64_t ds, int64_t nt,
                     int64_t nr, int64_t cw, bool first) {
    int64_t t = 0;
    for (; t + 4 <= nt; t += 4) ts_chunk_tokens(p, ps, g + t * gs, gs, dx + t * ds, ds, nr, cw, 4, first);
    for (; t < nt; t++) ts_chunk_tokens(p, ps, g + t * gs, gs, dx + t * ds, ds, nr, cw, 1, first);
}

/* Columns [i0, i1) of dx = g W: panels of at most TS_PANEL_MAX columns, each walked chunk by chunk.
 * deq NULL: f32 weights, read in place. */
EMBER_AI void ts_rows(const ember_matrix *w, const float *g, float *dx, int64_t n_tok, int64_t i0, int64_t i1,
                      ts_dequant_fn deq) {
    float panel[EMBER_MATMUL_T_CHUNK * TS_PANEL_MAX] __attribute__((aligned(32)));
    for (int64_t c0 = i0; c0 < i1; c0 += TS_PANEL_MAX) {
        const int64_t cw = i1 - c0 < TS_PANEL_MAX ? i1 - c0 : TS_PANEL_MAX;
        for (int64_t o0 = 0; o0 < w->n_out; o0 += EMBER_MATMUL_T_CHUNK) {
            const int64_t nr = w->n_out - o0 < EMBER_MATMUL_T_CHUNK ? w->n_out - o0 : EMBER_MATMUL_T_CHUNK;
            const float *p = panel;
            int64_t ps = cw;
            if (deq) deq(w, o0, nr, c0, cw, panel);
            else {
                p = (const float *)w->data + o0 * w->n_in + c0;
                ps = w->n_in;
            }
            ts_chunk(p, ps, g + o0, w->n_out, dx + c0, w->n_in, n_tok, nr, cw, o0 == 0);
        }
    }
}

static void ts_rows_f32(const ember_matrix *w, const float *g, float *dx, int64_t n_tok, int64_t i0, int64_t i1) {
    ts_rows(w, g, dx, n_tok, i0, i1, NULL);
}
static void ts_rows_f16(const ember_matrix *w, const float *g, float *dx, int64_t n_tok, int64_t i0, int64_t i1) {
    ts_rows(w, g, dx, n_tok, i0, i1, ts_deq_f16);
}
static void ts_rows_bf16(const ember_matrix *w, const float *g, float *dx, int64_t n_tok, int64_t i0, int64_t i1) {
    ts_rows(w, g, dx, n_tok, i0, i1, ts_deq_bf16);
}
/* The 2- to 6-bit types: their exact dequantizers (quants_dequant.c) fill the panel. */
static void ts_rows_generic(const ember_matrix *w, const float *g, float *dx, int64_t n_tok, int64_t i0, int64_t i1) {
    ts_rows(w, g, dx, n_tok, i0, i1, ts_deq_generic);
}

/* The transposed products of a SIMD set's table (.mm_t). */
#define TS_MM_T_ENTRIES                                                                                                \
    [EMBER_TYPE_F32] = ts_rows_f32, [EMBER_TYPE_F16] = ts_rows_f16, [EMBER_TYPE_BF16] = ts_rows_bf16,                  \
    [EMBER_TYPE_Q8_0] = tq_rows_q8_0, [EMBER_TYPE_Q4_0] = ts_rows_generic, [EMBER_TYPE_Q4_1] = ts_rows_generic,        \
    [EMBER_TYPE_Q5_0] = ts_rows_generic, [EMBER_TYPE_Q5_1] = ts_rows_generic, [EMBER_TYPE_Q2_K] = ts_rows_generic,     \
    [EMBER_TYPE_Q3_K] = ts_rows_generic, [EMBER_TYPE_Q4_K] = ts_rows_generic, [EMBER_TYPE_Q5_K] = ts_rows_generic,     \
    [EMBER_TYPE_Q6_K] = ts_rows_generic

#endif
