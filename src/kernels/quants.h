/* quants.h — the reference dequantizers and quantizers of GGUF's 4- to 6-bit weight blocks (Q4_0,
 * Q4_1, Q5_0, Q5_1, Q2_K ... Q6_K) and of Q8_K, blocks laid out byte for byte as ggml stores them.
 *
 * Every block holds its values in a fixed order; "value j" below is element j of the block.
 * Scales are f16 (uint16_t bits) except Q8_K's f32 d. 32-value blocks:
 *   Q4_0  d | qs[16]            value j = d * (q_j - 8),        q_j 4 bits: qs[j%16] low nibble
 *                                                               for j < 16, high nibble for j >= 16
 *   Q4_1  d, m | qs[16]         value j = d * q_j + m           (nibbles as Q4_0)
 *   Q5_0  d | qh[4] | qs[16]    value j = d * (q_j - 16),       q_j = nibble | bit j of qh (u32 LE) << 4
 *   Q5_1  d, m | qh[4] | qs[16] value j = d * q_j + m           (bits as Q5_0)
 * 256-value super-blocks ("K-quants"), made of sub-blocks with their own small integer scales:
 *   Q2_K  16 sub-blocks of 16: scale 4 bits, min 4 bits; 2-bit quants; value = d*sc*q - dmin*m
 *   Q3_K  16 sub-blocks of 16: signed 6-bit scales; 3-bit quants (2 low bits + hmask); d*sc*(q-4)
 *   Q4_K  8 sub-blocks of 32: 6-bit scale and min (12 packed bytes); value = d*sc*q - dmin*m
 *   Q5_K  as Q4_K with a fifth quant bit in qh
 *   Q6_K  16 sub-blocks of 16: int8 scales; 6-bit quants (4 in ql, 2 in qh); value = d*sc*(q-32)
 *   Q8_K  the activation type of the K-quant products: f32 d, 256 int8 quants, sums of 16
 * The exact bit positions are written out in quants_dequant.c, next to the code that reads them.
 *
 * The quantizers (quants_quantize.c) produce the same bytes as ggml's reference quantizers for the
 * same finite f32 input, including the scale searches of the K-quants (docs/kernels.md). */
#ifndef EMBER_QUANTS_H
#define EMBER_QUANTS_H

#include "types.h"

/* The block structs (ember_block_q4_0 ... ember_block_q6_K, ember_block_q8_K) and their sizes are
 * in types.h, with every other type's. */

/* ---- dequantization (quants_dequant.c): n values (a multiple of the block size) as f32,
 * computed with the same f32 operations in the same order as ggml's dequantize_row_<type>, so
 * every value is bit-identical to llama.cpp's own conversion of the file. ---- */
void ember_dequantize_row_q4_0(const void *src, float *dst, int64_t n);
void ember_dequantize_row_q4_1(const void *src, float *dst, int64_t n);
void ember_dequantize_row_q5_0(const void *src, float *dst, int64_t n);
void ember_dequantize_row_q5_1(const void *src, float *dst, int64_t n);
void ember_dequantize_row_q2_k(const void *src, float *dst, int64_t n);
void ember_dequantize_row_q3_k(const void *src, float *dst, int64_t n);
void ember_dequantize_row_q4_k(const void *src, float *dst, int64_t n);
void ember_dequantize_row_q5_k(const void *src, float *dst, int64_t n);
void ember_dequantize_row_q6_k(const void *src, float *dst, int64_t n);
void ember_dequantize_row_q8_k(const void *src, float *dst, int64_t n);

/* ---- quantization (quants_quantize.c): n finite f32 values (a multiple of the block size) into
 * blocks. Deterministic; byte-identical to ggml's quantize_row_<type>_ref (what llama-quantize
 * uses without an importance matrix). ---- */
void ember_quantize_row_q4_0(const float *src, void *dst, int64_t n);
void ember_quantize_row_q4_1(const float *src, void *dst, int64_t n);
void ember_quantize_row_q5_0(const float *src, void *dst, int64_t n);
void ember_quantize_row_q5_1(const float *src, void *dst, int64_t n);
void ember_quantize_row_q2_k(const float *src, void *dst, int64_t n);
void ember_quantize_row_q3_k(const float *src, void *dst, int64_t n);
void ember_quantize_row_q4_k(const float *src, void *dst, int64_t n);
void ember_quantize_row_q5_k(const float *src, void *dst, int64_t n);
void ember_quantize_row_q6_k(const float *src, void *dst, int64_t n);
void ember_quantize_row_q8_k(const float *src, void *dst, int64_t n);

#endif
