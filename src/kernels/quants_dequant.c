/* quants_dequant.c — the reference dequantizers of the 4- to 6-bit GGUF blocks and Q8_K (quants.h).
 * Each is written for clarity, and with ggml's f32 operations in ggml's order (built with
 * -ffp-contract=off, so no multiply-add is fused), which makes every value bit-identical to
 * llama.cpp's own F32 conversion of a file: the "exact weights" the parity references use. */
#include "quants.h"

#include "kernels.h"

#include <string.h>

/* A block read through memcpy: the source is a file mapping with no alignment promise. */
#define LOAD_BLOCK(blk, src, i) memcpy(&(blk), (const uint8_t *)(src) + (size_t)(i) * sizeof(blk), sizeof(blk))

/* ---- 32-value blocks: one f16 scale (and an f16 offset for the _1 types) ---- */

void ember_dequantize_row_q4_0(const void *src, float *dst, int64_t n) {
    for (int64_t b = 0; b < n / EMBER_QK4_0; b++) {
        ember_block_q4_0 blk;
        LOAD_BLOCK(blk, src, b);
        const float d = ember_f16_to_f32(blk.d);
        float *y = dst + b * EMBER_QK4_0;
        for (int j = 0; j < 16; j++) {
            y[j] = (float)((blk.qs[j] & 0x0F) - 8) * d; /* nibbles in [0,15] -> [-8,7] */
            y[j + 16] = (float)((blk.qs[j] >> 4) - 8) * d;
        }
    }
}

void ember_dequantize_row_q4_1(const void *src, float *dst, int64_t n) {
    for (int64_t b = 0; b < n / EMBER_QK4_1; b++) {
        ember_block_q4_1 blk;
        LOAD_BLOCK(blk, src, b);
        const float d = ember_f16_to_f32(blk.d), m = ember_f16_to_f32(blk.m);
        float *y = dst + b * EMBER_QK4_1;
        for (int j = 0; j < 16; j++) {
            y[j] = (float)(blk.qs[j] & 0x0F) * d + m;
            y[j + 16] = (float)(blk.qs[j] >> 4) * d + m;
        }
    }
}

/* The fifth bit of value j is bit j of qh read as a little-endian u32. */
static uint32_t load_qh(const uint8_t qh[4]) {
    return (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
}

void ember_dequantize_row_q5_0(const void *src, float *dst, int64_t n) {
    for (int64_t b = 0; b < n / EMBER_QK5_0; b++) {
        ember_block_q5_0 blk;
        LOAD_BLOCK(blk, src, b);
        const float d = ember_f16_to_f32(blk.d);
        const uint32_t qh = load_qh(blk.qh);
        float *y = dst + b * EMBER_QK5_0;
        for (int j = 0; j < 16; j++) {
            int q0 = (blk.qs[j] & 0x0F) | (int)((qh >> j) & 1) << 4; /* in [0,31] -> [-16,15] */
            int q1 = (blk.qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
            y[j] = (float)(q0 - 16) * d;
            y[j + 16] = (float)(q1 - 16) * d;
        }
    }
}

void ember_dequantize_row_q5_1(const void *src, float *dst, int64_t n) {
    for (int64_t b = 0; b < n / EMBER_QK5_1; b++) {
        ember_block_q5_1 blk;
        LOAD_BLOCK(blk, src, b);
        const float d = ember_f16_to_f32(blk.d), m = ember_f16_to_f32(blk.m);
        const uint32_t qh = load_qh(blk.qh);
        float *y = dst + b * EMBER_QK5_1;
        for (int j = 0; j < 16; j++) {
            int q0 = (blk.qs[j] & 0x0F) | (int)((qh >> j) & 1) << 4;
            int q1 = (blk.qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
            y[j] = (float)q0 * d + m;
            y[j + 16] = (float)q1 * d + m;
        }
    }
}

/* ---- 256-value super-blocks ---- */

/* Q2_K, Q3_K: each half of 128 values reads 32 quant bytes; value h*128 + 32*k + i (k < 4, i < 32)
 * is bits 2k..2k+1 of byte h*32 + i, and belongs to sub-block h*8 + 2k + i/16. */
void ember_dequantize_row_q2_k(const void *src, float *dst, int64_t n) {
    for (int64_t b = 0; b < n / EMBER_QK_K; b++) {
        ember_block_q2_K blk;
        LOAD_BLOCK(blk, src, b);
        const float d = ember_f16_to_f32(blk.d), dmin = ember_f16_to_f32(blk.dmin);
        float *y = dst + b * EMBER_QK_K;
        for (int v = 0; v < EMBER_QK_K; v++) {
            const int h = v / 128, k = (v % 128) / 32, i = v % 32;
            const uint8_t sc = blk.scales[v / 16];
            const float dl = d * (float)(sc & 0xF), ml = dmin * (float)(sc >> 4);
            const int q = (blk.qs[h * 32 + i] >> (2 * k)) & 3;
            y[v] = dl * (float)q - ml;
        }
    }
}

/* Q3_K's 6-bit scale j: low 4 bits in the nibbles of bytes 0-7 (byte j for j < 8, the high nibble of
 * byte j-8 after), high 2 bits in byte 8 + j%4 at bit 2*(j/4). Stored with +32: range [-32, 31]. */
static int q3_k_scale(const uint8_t s[12], int j) {
    int lo = j < 8 ? s[j] & 0xF : s[j - 8] >> 4;
    int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    return (lo | hi << 4) - 32;
}

void ember_dequantize_row_q3_k(const void *src, float *dst, int64_t n) {
    for (int64_t b = 0; b < n / EMBER_QK_K; b++) {
        ember_block_q3_K blk;
        LOAD_BLOCK(blk, src, b);
        const float d = ember_f16_to_f32(blk.d);
        float *y = dst + b * EMBER_QK_K;
        for (int v = 0; v < EMBER_QK_K; v++) {
            const int h = v / 128, k = (v % 128) / 32, i = v % 32;
            const float dl = d * (float)q3_k_scale(blk.scales, v / 16);
            int q = (blk.qs[h * 32 + i] >> (2 * k)) & 3;
            /* the third bit is bit v/32 of hmask[v%32]; a clear bit means q - 4 (range [-4, 3]) */
            if (!((blk.hmask[i] >> (v / 32)) & 1)) q -= 4;
            y[v] = dl * (float)q;
        }
    }
}

/* Q4_K / Q5_K: the 6-bit scale and min of sub-block j (of 8) from the 12 packed bytes: for j < 4
 * bytes j and j+4 (low 6 bits); for j >= 4 the nibbles of byte j+4 plus the top 2 bits of bytes
 * j-4 (scale) and j (min). */
static void k4_scale_min(const uint8_t s[12], int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | (s[j - 4] >> 6) << 4;
        *m = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
    }
}

/* Each 64 values (chunk c) read 32 quant bytes: values 64c .. 64c+31 are the low nibbles (sub-block
 * 2c), 64c+32 .. 64c+63 the high nibbles (sub-block 2c+1). */
void ember_dequantize_row_q4_k(const void *src, float *dst, int64_t n) {
    for (int64_t b = 0; b < n / EMBER_QK_K; b++) {
        ember_block_q4_K blk;
        LOAD_BLOCK(blk, src, b);
        const float d = ember_f16_to_f32(blk.d), dmin = ember_f16_to_f32(blk.dmin);
        float *y = dst + b * EMBER_QK_K;
        for (int j = 0; j < 8; j++) {
            int sc, m;
            k4_scale_min(blk.scales, j, &sc, &m);
            const float dl = d * (float)sc, ml = dmin * (float)m;
            const uint8_t *q = blk.qs + 32 * (j / 2);
            const int shift = 4 * (j % 2);
            for (int i = 0; i < 32; i++) y[32 * j + i] = dl * (float)((q[i] >> shift) & 0xF) - ml;
        }
    }
}

/* Q5_K: as Q4_K, plus the fifth bit of value 32j + i in bit j of qh[i]. */
void ember_dequantize_row_q5_k(const void *src, float *dst, int64_t n) {
    for (int64_t b = 0; b < n / EMBER_QK_K; b++) {
        ember_block_q5_K blk;
        LOAD_BLOCK(blk, src, b);
        const float d = ember_f16_to_f32(blk.d), dmin = ember_f16_to_f32(blk.dmin);
        float *y = dst + b * EMBER_QK_K;
        for (int j = 0; j < 8; j++) {
            int sc, m;
            k4_scale_min(blk.scales, j, &sc, &m);
            const float dl = d * (float)sc, ml = dmin * (float)m;
            const uint8_t *q = blk.qs + 32 * (j / 2);
            const int shift = 4 * (j % 2);
            for (int i = 0; i < 32; i++) {
                int v = ((q[i] >> shift) & 0xF) | ((blk.qh[i] >> j) & 1) << 4; /* in [0, 31] */
                y[32 * j + i] = dl * (float)v - ml;
            }
        }
    }
}

/* Q6_K: each half h of 128 values reads 64 ql bytes and 32 qh bytes: value h*128 + 32*k + i is the
 * low (k = 0, 1) or high (k = 2, 3) nibble of ql[h*64 + 32*(k%2) + i] with bits 2k..2k+1 of
 * qh[h*32 + i] on top, minus 32 (range [-32, 31]); its scale is scales[v / 16]. */
void ember_dequantize_row_q6_k(const void *src, float *dst, int64_t n) {
    for (int64_t b = 0; b < n / EMBER_QK_K; b++) {
        ember_block_q6_K blk;
        LOAD_BLOCK(blk, src, b);
        const float d = ember_f16_to_f32(blk.d);
        float *y = dst + b * EMBER_QK_K;
        for (int v = 0; v < EMBER_QK_K; v++) {
            const int h = v / 128, k = (v % 128) / 32, i = v % 32;
            const uint8_t l = blk.ql[h * 64 + 32 * (k % 2) + i];
            const int lo = k < 2 ? l & 0xF : l >> 4;
            const int hi = (blk.qh[h * 32 + i] >> (2 * k)) & 3;
            /* ggml computes d * sc * q as (d * sc) * q */
            y[v] = d * (float)blk.scales[v / 16] * (float)((lo | hi << 4) - 32);
        }
    }
}

void ember_dequantize_row_q8_k(const void *src, float *dst, int64_t n) {
    for (int64_t b = 0; b < n / EMBER_QK_K; b++) {
        ember_block_q8_K blk;
        LOAD_BLOCK(blk, src, b);
        for (int i = 0; i < EMBER_QK_K; i++) dst[b * EMBER_QK_K + i] = blk.d * (float)blk.qs[i];
    }
}
